"""The distribution's commands follow the ecosystem's conventions (issue 37): each answers
`--version` with pyproject.toml's version, as `netreduce.__version__` does; `--help`
explains every option of every command and subcommand and shows every default; the
`netreduce` logger has a NullHandler; the torch extra promises what CI tests."""
from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Callable, Iterator

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


def parsers() -> dict[str, argparse.ArgumentParser]:
    """Each command's parser, as its entry point builds it."""
    from netreduce.tools import cli
    from switch import ctl, daemon
    return {"netreduce": cli.parser(), "netreduce-switch": daemon.build_parser(),
            "netreduce-ctl": ctl.build_parser()}


def every_parser(name: str, parser: argparse.ArgumentParser
                 ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """`parser` and its subcommands' parsers, recursively, each with its command line."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from every_parser(f"{name} {sub}", subparser)


def help_block(text: str, action: argparse.Action) -> str:
    """What `--help` (`text`) says of `action`, whitespace collapsed: its line (two spaces
    in, then its option strings or its name) and the lines indented further below it."""
    start = ", ".join(action.option_strings) or str(action.metavar or action.dest)
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("  " + start)
                 and not line.startswith("   "))
    block = [lines[first]]
    for line in lines[first + 1:]:
        if not line.startswith("   "):
            break
        block.append(line)
    return " ".join(" ".join(block).split())


def shown_options() -> Iterator[tuple[str, argparse.Action, str]]:
    for command, top in parsers().items():
        for name, parser in every_parser(command, top):
            text = parser.format_help()
            for action in parser._actions:
                if action.help != argparse.SUPPRESS and not isinstance(
                        action, (argparse._HelpAction, argparse._VersionAction)):
                    yield name, action, help_block(text, action)


def test_the_parsers_are_the_entry_points() -> None:
    assert sorted(parsers()) == sorted(SCRIPTS)
    assert entry_point(SCRIPTS["netreduce-switch"]).__module__ == "switch.daemon"
    assert entry_point(SCRIPTS["netreduce-ctl"]).__module__ == "switch.ctl"
    assert entry_point(SCRIPTS["netreduce"]).__module__ == "netreduce.tools.cli"


def test_help_explains_every_option_and_shows_every_default() -> None:
    """Every option and argument of every command and subcommand has help, and where it has
    a default (not None, False or an empty list) its help shows the word and the value."""
    seen, bad = 0, []
    for name, action, block in shown_options():
        seen += 1
        words = block.split(" ", 1)
        if len(words) < 2 or (action.nargs != 0 and len(block.split()) <= 2):
            bad.append(f"{name} {action.dest}: no help: {block!r}")
        default = action.default
        if default is None or default is False or default == []:
            continue
        if "default" not in block or str(default) not in block:
            bad.append(f"{name} {action.dest}: default {default!r} not shown: {block!r}")
    assert seen > 60 and not bad, "\n".join(bad)


@pytest.mark.parametrize("command, option, shown", [
    ("netreduce launch", "--port", "(default: 29500)"),
    ("netreduce launch", "--timeout", "(default: 3600.0)"),
    ("netreduce launch", "--grace", "(default: 10.0)"),
    ("netreduce bench", "--jobs", "(default: 5)"),
    ("netreduce bench", "--warmup", "(default: 1)"),
    ("netreduce bench", "--seed", "(default: 1)"),
    ("netreduce bench", "--msg-size", "(default: 256K)"),
    ("netreduce demo", "--iters", "(default: 3)"),
    ("netreduce-switch", "--max-in-flight", "(default: 0)"),
])
def test_the_issues_defaults_are_in_help(command: str, option: str, shown: str) -> None:
    """The defaults issue 37 found hidden, each as written (an oracle apart from the parser)."""
    blocks = {(name, action.option_strings[0]): block for name, action, block in
              shown_options() if action.option_strings}
    assert blocks[(command, option)].endswith(shown), blocks[(command, option)]


def test_the_torch_extras_lower_bound_is_the_version_ci_tests() -> None:
    """netreduce.torch uses private torch members: pyproject promises no torch older than
    the one scripts/install.sh pins for CI (scripts/constraints-torch.txt)."""
    extra = PYPROJECT["project"]["optional-dependencies"]["torch"]
    bound = re.fullmatch(r"torch>=(\d+(?:\.\d+)*)", extra[0])
    pins = re.findall(r"^torch==(\d+(?:\.\d+)*)", (ROOT / "scripts/constraints-torch.txt")
                      .read_text(), re.M)
    assert len(extra) == 1 and bound and len(pins) == 1, (extra, pins)
    lower = [int(x) for x in bound.group(1).split(".")]
    assert [int(x) for x in pins[0].split(".")][:len(lower)] == lower, (extra, pins)


LOGGING = """
import logging, sys
import netreduce
print([type(h).__name__ for h in logging.getLogger("netreduce").handlers])
logging.getLogger("netreduce.comm").warning("unconfigured: never shown")
logging.basicConfig(stream=sys.stdout, format="%(name)s %(message)s")
logging.getLogger("netreduce.comm").warning("configured: the program's handler")
"""


def test_the_netreduce_logger_has_a_null_handler() -> None:
    """A fresh interpreter: importing netreduce adds a NullHandler to the "netreduce" logger
    (a warning with no logging configured goes nowhere: not to logging's last-resort stderr
    handler) and records still reach the handlers the program configures."""
    run = subprocess.run([sys.executable, "-c", LOGGING], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["['NullHandler']",
                                       "netreduce.comm configured: the program's handler"]
    assert run.stderr == ""
