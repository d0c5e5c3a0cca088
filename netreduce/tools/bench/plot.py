"""The bench's figure: algbw against size for every algorithm, with the measured link rate
B (the in-network ceiling) and the ring's theoretical ceiling B * n / (2(n-1)); beside it
the time per call against size (log-log), with the RC round trip when it was measured; on a
two-tier fabric also the bytes over the ToR-spine links per call, per byte of message."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from netreduce.tools.bench.runplan import LINK, RTT, format_size
from netreduce.tools.bench.results import Result


def _size_axes(ax: Any, results: list[Result], dtype: str, ylabel: str, title: str,
               log_y: bool = False) -> None:
    """Message sizes on a log2 x axis, `ylabel` from 0 (or logarithmic), a grid, a legend."""
    ticks = sorted({r.size_bytes for r in results})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [format_size(s) for s in ticks], rotation=45 if len(ticks) > 6 else 0,
                  fontsize="small")
    ax.set_xlabel(f"message size ({dtype})")
    ax.set_ylabel(ylabel)
    if log_y:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")


def _by_size(results: list[Result], algo: str) -> list[Result]:
    return sorted((r for r in results if r.algo == algo), key=lambda r: r.size_bytes)


def plot(results: list[Result], workers: int, dtype: str, path: Path) -> None:
    lab = os.environ.get("NR_LAB_DIR")
    if lab:     # the lab VM's HOME is read-only: keep matplotlib's font cache across boots
        os.environ.setdefault("MPLCONFIGDIR", os.path.join(lab, "matplotlib"))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spine = [r for r in results if r.spine_bytes_per_call is not None]
    panels = 3 if spine else 2
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.8))
    ax, ax_time = axes[0], axes[1]
    if spine:
        ax2 = axes[2]
        for algo in dict.fromkeys(r.algo for r in spine):
            rows = sorted((r for r in spine if r.algo == algo), key=lambda r: r.size_bytes)
            ax2.plot([r.size_bytes for r in rows],
                     [r.spine_bytes_per_call / r.size_bytes for r in rows], "o-", label=algo)
        _size_axes(ax2, spine, dtype, "bytes over ToR–spine links per call / message size",
                   "traffic through the spine (all links, both directions)")
    link = _by_size(results, LINK)
    if link:
        sizes = [r.size_bytes for r in link]
        rates = [r.algbw_gbps for r in link]
        ax.plot(sizes, rates, "k--", label="link B (ring WRITEs, forwarded)")
        if workers > 1:
            ceiling = workers / (2 * (workers - 1))
            ax.plot(sizes, [b * ceiling for b in rates], "k:",
                    label=f"ring ceiling B·n/2(n−1) = {ceiling:.2f}·B")
        ax_time.plot(sizes, [r.median_us for r in link], "k--", label="link (one WRITE each)")
    rtt = _by_size(results, RTT)
    if rtt:
        ax_time.plot([r.size_bytes for r in rtt], [r.median_us for r in rtt], "k-.",
                     label="RC round trip (8 B ping-pong)")
    for algo in dict.fromkeys(r.algo for r in results if r.algo not in (LINK, RTT)):
        rows = _by_size(results, algo)
        sizes = [r.size_bytes for r in rows]
        ax.plot(sizes, [r.algbw_gbps for r in rows], "o-", label=f"{algo} allreduce algbw")
        ax_time.plot(sizes, [r.median_us for r in rows], "o-", label=f"{algo} allreduce")
    real = [r for r in results if r.algo != RTT]
    _size_axes(ax, real, dtype, "Gbit/s", f"NetReduce allreduce, {workers} workers")
    _size_axes(ax_time, results, dtype, "time per call (µs, median)",
               f"time per call, {workers} workers", log_y=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
