"""``python -m ebfl.cli``: the ``ebfl`` command."""

import sys

from ebfl.cli import main

if __name__ == "__main__":  # not when a tool imports every module (doctests, the wheel test)
    sys.exit(main())
