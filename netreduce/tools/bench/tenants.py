"""`netreduce bench --tenants T`: T independent jobs at once through one switch or fabric.

The lab's hosts are split into T contiguous groups, as evenly as possible (`split_hosts`);
tenant t is a job of its own on its group: its own launch (rank I on host first + I), its
own rendezvous (its rank 0's address, MASTER_PORT = --port + t, its own NR_JOB_SECRET), its
own ring at the switch, registered under its own principal (`--tenant-tokens`: one token
file per tenant; default $NR_LAB_TENANT_TOKENS, which scripts/lab.sh sets; without them
every tenant uses the one token of $NR_CONTROLLER_TOKEN, said once). All start together and
run the same plan independently, each result verified against numpy as when alone.
Invariant: a tenant's failure or refusal (e.g. the switch's aggregator memory is taken:
`--max-slot-memory`, RESOURCE_EXHAUSTED) is that tenant's exit code and message; the others
run to their end.
Report: each tenant's table, then per algorithm and size every tenant's algbw, their sum
(the aggregate throughput), each one's share of it and Jain's fairness index
(1 = equal shares, 1/T = one tenant has it all), plus how long the tenants' runs overlapped.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any, TextIO

from netreduce.tools.bench.gather import RankLines, meta
from netreduce.tools.bench.runplan import LINK, BenchPlan, format_size
from netreduce.tools.bench.progressbar import Progress
from netreduce.tools.bench.results import Result, document, table
from netreduce.tools.launch import LaunchResult, launch
from nr_contract.tokens import TOKEN_ENV

TENANT_TOKENS_ENV = "NR_LAB_TENANT_TOKENS"    # the lab's per-tenant token files, ':'-separated


def split_hosts(workers: int, tenants: int) -> list[tuple[int, int]]:
    """(first host, ranks) per tenant: contiguous groups, sizes differing by at most one;
    ValueError unless every tenant gets at least 2 ranks (the switch aggregates 2 or more)."""
    if tenants < 1 or workers < 2 * tenants:
        raise ValueError(f"--tenants {tenants} over --workers {workers}: every "
                         "tenant needs 2 or more hosts")
    groups, first = [], 0
    for t in range(tenants):
        size = workers // tenants + (t < workers % tenants)
        groups.append((first, size))
        first += size
    return groups


def tenant_tokens(text: str | None, tenants: int) -> list[str | None]:
    """Each tenant's token file, from --tenant-tokens or $NR_LAB_TENANT_TOKENS (',' or ':'
    separated); None everywhere when neither is given (the tenants share $NR_CONTROLLER_TOKEN)."""
    text = text if text is not None else os.environ.get(TENANT_TOKENS_ENV, "")
    files = [f for f in text.replace(":", ",").split(",") if f]
    if not files:
        return [None] * tenants
    if len(files) < tenants:
        raise ValueError(f"{tenants} tenants but {len(files)} token file(s) "
                         f"({', '.join(files)}): one per tenant")
    return list(files[:tenants])


class _Serialized(io.TextIOBase):
    """A sink written by several launches' threads: one write at a time."""

    def __init__(self, sink: TextIO, lock: threading.Lock) -> None:
        self.sink, self.lock = sink, lock

    def write(self, text: str) -> int:
        with self.lock:
            return self.sink.write(text)


def jain(values: list[float]) -> float:
    """Jain's fairness index of the values: (sum x)^2 / (n * sum x^2)."""
    square = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * square) if square else 1.0


def sharing(per_tenant: list[list[Result]]) -> list[dict[str, Any]]:
    """Per algorithm and size every tenant measured: algbw per tenant, sum, shares, Jain."""
    rows = []
    for first in per_tenant[0]:
        found = [next((r for r in results if (r.algo, r.size_bytes) ==
                       (first.algo, first.size_bytes)), None) for results in per_tenant]
        if any(r is None for r in found):
            continue
        rates = [r.algbw_gbps for r in found if r is not None]
        total = sum(rates)
        rows.append({"algo": first.algo, "size_bytes": first.size_bytes,
                     "algbw_gbps": rates, "aggregate_gbps": total,
                     "shares": [x / total if total else 0.0 for x in rates],
                     "jain": jain(rates)})
    return rows


def sharing_lines(rows: list[dict[str, Any]]) -> list[str]:
    tenants = len(rows[0]["algbw_gbps"]) if rows else 0
    head = (f"{'algo':>8}{'size':>9}" + "".join(f"{f't{t} algbw':>12}" for t in range(tenants))
            + f"{'aggregate':>12}{'shares':>{8 * tenants + 2}}{'Jain':>7}")
    lines = ["Tenants side by side (algbw, Gbit/s; each tenant's own median):", head]
    for row in rows:
        lines.append(f"{row['algo']:>8}{format_size(row['size_bytes']):>9}"
                     + "".join(f"{x:>12.4f}" for x in row["algbw_gbps"])
                     + f"{row['aggregate_gbps']:>12.4f}  "
                     + "".join(f"{s:>8.1%}" for s in row["shares"]) + f"{row['jain']:>7.3f}")
    return lines


def run_tenants(args: argparse.Namespace, plan: BenchPlan) -> int:
    """The whole --tenants run; the exit code (see the module doc)."""
    try:
        groups = split_hosts(plan.workers, args.tenants)
        tokens = tenant_tokens(args.tenant_tokens, args.tenants)
    except ValueError as exc:
        print(f"netreduce bench: {exc}", file=sys.stderr)
        return 2
    if tokens[0] is None:
        print(f"netreduce bench: no --tenant-tokens (nor ${TENANT_TOKENS_ENV}): every tenant "
              f"registers as the principal of ${TOKEN_ENV}", file=sys.stderr)
    plans = [BenchPlan(**{**vars(plan), "workers": n}) for _, n in groups]
    progress = Progress(sum(p.units for p in plans))
    lock = threading.Lock()
    sinks = [RankLines(p, progress, label=f"[tenant {t}] ") for t, p in enumerate(plans)]
    cmd_base = [sys.executable, "-m", "netreduce.tools.bench.worker", "--plan"]
    launched: list[LaunchResult | None] = [None] * len(groups)
    spans: list[tuple[float, float]] = [(0.0, 0.0)] * len(groups)
    errors: list[str | None] = [None] * len(groups)
    started = datetime.now(timezone.utc)

    def one(t: int) -> None:
        first, _ = groups[t]
        env = dict(os.environ)
        if tokens[t] is not None:
            env[TOKEN_ENV] = tokens[t]
        t0 = time.monotonic()
        try:
            launched[t] = launch([*cmd_base, plans[t].to_json()], plans[t].workers,
                                 port=args.port + t, timeout=args.timeout,
                                 out=_Serialized(sinks[t], lock), env=env, first_host=first)
        except ValueError as exc:
            errors[t] = str(exc)
        spans[t] = (t0, time.monotonic())

    threads = [threading.Thread(target=one, args=(t,)) for t in range(len(groups))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    progress.close()
    code = 0
    docs = []
    for t, ((first, n), result) in enumerate(zip(groups, launched)):
        hosts = f"h{first}..h{first + n - 1}"
        if errors[t] is not None or result is None or not result.ok:
            why = errors[t] or f"its workers failed (exit {result.exit_code if result else '?'})"
            print(f"netreduce bench: tenant {t} ({hosts}): {why}", file=sys.stderr)
            code = code or (2 if errors[t] else result.exit_code if result else 1)
            continue
        results = sinks[t].measured()
        print(f"\n== tenant {t}: {n} ranks on {hosts}, principal of "
              f"{tokens[t] or os.environ.get(TOKEN_ENV, 'no token')} ==")
        for line in table(results):
            print(line)
        docs.append(document({**meta(plans[t], started), "tenant": t, "first_host": first,
                              "token_file": tokens[t]}, results))
        if not all(r.verified for r in results):
            print(f"netreduce bench: tenant {t}: some results did not match numpy",
                  file=sys.stderr)
            code = code or 1
    if code:
        return code
    rows = sharing([sinks[t].measured() for t in range(len(groups))])
    begin, end = max(s for s, _ in spans), min(e for _, e in spans)
    overlap = max(0.0, end - begin) / max(e - s for s, e in spans)
    print()
    for line in sharing_lines([r for r in rows if r["algo"] != LINK] or rows):
        print(line)
    print(f"The tenants' runs overlapped for {overlap:.0%} of the longest one.")
    if args.json:
        args.json.write_text(json.dumps({"tenants": docs, "sharing": rows,
                                         "overlap": overlap}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
