"""The `netreduce` command: `netreduce COMMAND [OPTIONS]` (`netreduce COMMAND --help`).

Commands: bench (allreduce throughput in the lab, netreduce.bench).
"""
from __future__ import annotations

import argparse
import sys

from netreduce.bench import __doc__ as BENCH_DOC
from netreduce.bench import runner


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="netreduce", description=__doc__.split("\n\n")[0])
    commands = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench = commands.add_parser("bench", help=BENCH_DOC.split("\n")[0], description=BENCH_DOC,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    runner.add_arguments(bench)
    bench.set_defaults(run=runner.run)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
