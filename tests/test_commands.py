"""The distribution's commands follow the ecosystem's conventions (issue 37): each answers
`--version` with pyproject.toml's version, as `netreduce.__version__` does."""
from __future__ import annotations

import importlib
import tomllib
from pathlib import Path
from typing import Callable

import pytest

import netreduce

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SCRIPTS: dict[str, str] = PYPROJECT["project"]["scripts"]


def entry_point(spec: str) -> Callable[[list[str]], int]:
    """The function a [project.scripts] value "module:function" names."""
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(module), function)


def test_the_commands_are_the_three_the_readme_names() -> None:
    assert sorted(SCRIPTS) == ["netreduce", "netreduce-ctl", "netreduce-switch"]


def test_the_version_is_pyprojects_read_from_the_installed_metadata() -> None:
    assert netreduce.__version__ == PYPROJECT["project"]["version"]
    assert "__version__" in netreduce.__all__


@pytest.mark.parametrize("command", sorted(SCRIPTS))
def test_every_command_answers_version(command: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        entry_point(SCRIPTS[command])(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"{command} {PYPROJECT['project']['version']}\n"
