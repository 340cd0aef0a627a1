"""A file server on 127.0.0.1 for the download tests: good, corrupted and interrupted transfers.

``GET /<mode>/<name>`` serves ``files[name]``:

* ``good``: as is;
* ``bad``: with its last byte flipped (a corrupted transfer of the right length);
* ``cut``: announces the full length, sends half, hangs up (an interrupted transfer).

Every requested path is appended to ``hits``.
"""

import contextlib
import http.server
import threading


class LoopbackFiles:
    def __init__(self, files=None):
        self.files = dict(files or {})
        self.hits = []
        self.url = None

    def _handler(self):
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server API)
                server.hits.append(self.path)
                mode, _, name = self.path.lstrip("/").partition("/")
                body = server.files.get(name)
                if body is None or mode not in ("good", "bad", "cut"):
                    self.send_error(404)
                    return
                if mode == "bad":
                    body = body[:-1] + bytes([body[-1] ^ 1])
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if mode == "cut":
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    return
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        return Handler


@contextlib.contextmanager
def serve(files=None):
    """Run a :class:`LoopbackFiles` server for the ``with`` block; yields it (``.url`` set)."""
    state = LoopbackFiles(files)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), state._handler())
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
