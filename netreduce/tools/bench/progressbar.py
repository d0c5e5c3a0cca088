"""A progress bar on stderr that lets result lines through on stdout.

On a terminal the bar is redrawn in place; elsewhere (a log, `scripts/lab.sh`'s output) a
bar line is written only when the phase changes or the run completes.
"""
from __future__ import annotations

import sys
from typing import TextIO


class Progress:
    def __init__(self, total: int, out: TextIO | None = None, err: TextIO | None = None,
                 width: int = 30) -> None:
        self.total, self.width = total, width
        self.out = sys.stdout if out is None else out
        self.err = sys.stderr if err is None else err
        self.done = 0
        self.phase = ""
        self._live = self.err.isatty()
        self._drawn = False

    def bar(self) -> str:
        filled = self.width * self.done // self.total if self.total else self.width
        return (f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
                f"jobs  {self.phase}")

    def _draw(self) -> None:
        if self._live:
            self.err.write("\r\x1b[K" + self.bar())
            self._drawn = True
        else:
            self.err.write(self.bar() + "\n")
        self.err.flush()

    def _clear(self) -> None:
        if self._drawn:
            self.err.write("\r\x1b[K")
            self.err.flush()
            self._drawn = False

    def advance(self, phase: str) -> None:
        """One more job done; `phase` says what is being measured."""
        self.done += 1
        changed = phase != self.phase
        self.phase = phase
        if self._live or changed or self.done == self.total:
            self._draw()

    def print(self, line: str, *, err: bool = False) -> None:
        """A line on stdout (stderr with `err`), without tearing the bar."""
        self._clear()
        stream = self.err if err else self.out
        stream.write(line + "\n")
        stream.flush()
        if self._live:
            self._draw()

    def close(self) -> None:
        if self._drawn:
            self.err.write("\n")
            self.err.flush()
            self._drawn = False
