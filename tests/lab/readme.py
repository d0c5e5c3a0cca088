"""The README's code as a lab test runs it: the ```python snippets of "The library", and the
shell commands that run inside the lab (`scripts/lab.sh ... -- CMD`: CMD, what the lab's
shell runs). Read from README.md at test time, so that a test runs what the README says,
not a copy of it."""
from __future__ import annotations

import re
import shlex

from tests.lab.labhosts import ROOT

README = ROOT / "README.md"


def readme_snippets() -> list[str]:
    """The ```python blocks of the README's "The library" section, in order."""
    section = README.read_text().split("\n## The library\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def lab_commands() -> list[list[str]]:
    """Every CMD of a `scripts/lab.sh [OPTIONS] -- CMD` in the README's ```sh blocks, as argv,
    in order: continuation lines joined, a trailing `# comment` cut, `A && B` taken apart."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", README.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            command: list[str] = []
            for word in [*shlex.split(line, comments=True), "&&"]:
                if word != "&&":
                    command.append(word)
                    continue
                if command[:1] == ["scripts/lab.sh"] and "--" in command:
                    commands.append(command[command.index("--") + 1:])
                command = []
    return commands


def lab_command(*start: str) -> list[str]:
    """The README's only in-lab command (`lab_commands`) that starts with the words `start`."""
    found = [c for c in lab_commands() if c[:len(start)] == list(start)]
    assert len(found) == 1, (f"the README has {len(found)} lab commands starting "
                             f"{' '.join(start)!r}, not one: {lab_commands()}")
    return found[0]
