"""What every part of the installed `netreduce` distribution shares, beneath the host library
and the switch alike: its version and its commands' conventions.

- `__version__`: the installed distribution's version, read from its metadata
  (importlib.metadata), so pyproject.toml's `version` is its one home; a source tree that
  was never installed says "0+unknown" (PEP 440: a local version of nothing).
- `add_version(parser)`: `--version` prints `PROG VERSION` and exits 0.
- `HelpFormatter`: the description as written (its line breaks kept) and every option's
  default in `--help`, "(default: X)" after its help, unless the help already shows it with
  `%(default)s`; options without a default (None), flags (False) and repeatable options
  that start empty show none.
"""
from __future__ import annotations

import argparse
from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "netreduce"

try:
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:        # a source tree on PYTHONPATH, never pip-installed
    __version__ = "0+unknown"


def add_version(parser: argparse.ArgumentParser) -> None:
    """`--version`: print the command's name and the distribution's version, exit 0."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")


class HelpFormatter(argparse.RawDescriptionHelpFormatter,
                    argparse.ArgumentDefaultsHelpFormatter):
    """argparse's two public formatters in one (see the module doc for what shows)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        default = action.default
        if default is None or default is False or default == []:
            return action.help or ""
        return super()._get_help_string(action) or ""
