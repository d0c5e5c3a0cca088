"""The `netreduce` command: `netreduce COMMAND [OPTIONS]` (`netreduce COMMAND --help`).

Commands: launch (one rank per lab host, torchrun style), demo (the main job: one checked
allreduce per rank and its goodput), bench (allreduce throughput in the lab). The switch and
its controller have commands of their own: `netreduce-switch` and `netreduce-ctl`.
"""
from __future__ import annotations

import argparse
import sys

from netreduce.tools import demo, launch
from netreduce.tools.bench import __doc__ as BENCH_DOC, runner
from nr_contract.distribution import HelpFormatter, add_version


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="netreduce", description=__doc__,
                                formatter_class=HelpFormatter)
    add_version(p)
    commands = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in (("launch", launch), ("demo", demo)):
        doc = module.__doc__ or ""
        sub = commands.add_parser(name, help=doc.split("\n")[0], description=doc,
                                  formatter_class=HelpFormatter)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    bench = commands.add_parser("bench", help=BENCH_DOC.split("\n")[0], description=BENCH_DOC,
                                formatter_class=HelpFormatter)
    runner.add_arguments(bench)
    bench.set_defaults(run=runner.run)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
