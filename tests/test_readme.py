"""The README's Python examples run as written.

A block whose first line is ``# needs the NAME data`` (a dataset folder of the
data home) runs in a test of its own that skips, naming the dataset, when the
data home lacks it; the other blocks run in order, in one namespace.
"""

import re
from pathlib import Path

import pytest

from tests.conftest import has_dataset, missing_data_reason

README = Path(__file__).parent.parent / "README.md"
NEEDS = re.compile(r"# needs the ([\w-]+) data\n")


def _blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_python_blocks_run():
    plain = [b for b in _blocks() if not NEEDS.match(b)]
    assert len(plain) >= 4
    namespace = {}
    exec(compile("\n".join(plain), str(README), "exec"), namespace)  # noqa: S102


@pytest.mark.parametrize("block", [b for b in _blocks() if NEEDS.match(b)])
def test_readme_blocks_with_data_run(block):
    folder = NEEDS.match(block).group(1)
    if not has_dataset(folder):
        pytest.skip(missing_data_reason(folder))
    exec(compile(block, str(README), "exec"), {})  # noqa: S102
