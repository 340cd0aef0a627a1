"""The README's Python examples run as written."""

import re
from pathlib import Path

README = Path(__file__).parent.parent / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 4
    namespace = {}
    exec(compile("\n".join(blocks), str(README), "exec"), namespace)  # noqa: S102
