"""The README's code as a lab test runs it: the ```python snippets of "The library". Read
from README.md at test time, so that a test runs what the README says, not a copy of it."""
from __future__ import annotations

import re

from tests.lab.labhosts import ROOT

README = ROOT / "README.md"


def readme_snippets() -> list[str]:
    """The ```python blocks of the README's "The library" section, in order."""
    section = README.read_text().split("\n## The library\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)

