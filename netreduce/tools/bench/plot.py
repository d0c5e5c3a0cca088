"""The bench's figure: algbw against size for every algorithm, with the measured link rate
B (the in-network ceiling) and the ring's theoretical ceiling B * n / (2(n-1)); on a
two-tier fabric beside it the bytes over the ToR-spine links per call, per byte of message."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from netreduce.tools.bench.plan import LINK, format_size
from netreduce.tools.bench.report import Result


def _size_axes(ax: Any, results: list[Result], dtype: str, ylabel: str, title: str) -> None:
    """Message sizes on a log2 x axis, `ylabel` from 0, a grid and the legend."""
    ticks = sorted({r.size_bytes for r in results})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [format_size(s) for s in ticks])
    ax.set_xlabel(f"message size ({dtype})")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")


def plot(results: list[Result], workers: int, dtype: str, path: Path) -> None:
    lab = os.environ.get("NR_LAB_DIR")
    if lab:     # the lab VM's HOME is read-only: keep matplotlib's font cache across boots
        os.environ.setdefault("MPLCONFIGDIR", os.path.join(lab, "matplotlib"))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spine = [r for r in results if r.spine_bytes_per_call is not None]
    if spine:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        for algo in dict.fromkeys(r.algo for r in spine):
            rows = sorted((r for r in spine if r.algo == algo), key=lambda r: r.size_bytes)
            ax2.plot([r.size_bytes for r in rows],
                     [r.spine_bytes_per_call / r.size_bytes for r in rows], "o-", label=algo)
        _size_axes(ax2, spine, dtype, "bytes over ToR–spine links per call / message size",
                   "traffic through the spine (all links, both directions)")
    else:
        fig, ax = plt.subplots(figsize=(7, 4.5))
    link = sorted((r for r in results if r.algo == LINK), key=lambda r: r.size_bytes)
    if link:
        sizes = [r.size_bytes for r in link]
        rates = [r.algbw_gbps for r in link]
        ax.plot(sizes, rates, "k--", label="link B (ring WRITEs, forwarded)")
        if workers > 1:
            ceiling = workers / (2 * (workers - 1))
            ax.plot(sizes, [b * ceiling for b in rates], "k:",
                    label=f"ring ceiling B·n/2(n−1) = {ceiling:.2f}·B")
    for algo in dict.fromkeys(r.algo for r in results if r.algo != LINK):
        rows = sorted((r for r in results if r.algo == algo), key=lambda r: r.size_bytes)
        ax.plot([r.size_bytes for r in rows], [r.algbw_gbps for r in rows], "o-",
                label=f"{algo} allreduce algbw")
    _size_axes(ax, results, dtype, "Gbit/s", f"NetReduce allreduce, {workers} workers")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
