"""Plots (matplotlib, an optional extra): of compare cells, speedup per model and strategy,
registers and spills per CUDA kernel; of bench rows, CostFuse's speedup over each column."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

from .cells import Cell
from .tables import speedups

__all__ = ["plot_bench", "plot_registers", "plot_speedup"]


def plot_speedup(cells: Sequence[Cell], path: str | os.PathLike, target: str,
                 baseline: str = "tvm") -> str | None:
    """Grouped bars: speedup of each strategy over ``baseline`` per model on ``target``
    (measured, or predicted where the target was not measured)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sp = speedups(cells, baseline)
    keys = [k for k in sp if k[2] in (target, f"{target} (predicted)")]
    if not keys:
        return None
    predicted = all(k[2].endswith("(predicted)") for k in keys)
    models = list(dict.fromkeys(k[0] for k in keys))
    strategies = [s for s in dict.fromkeys(c.strategy for c in cells)
                  if any(k[1] == s for k in keys)]
    width = 0.8 / max(1, len(strategies))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(models) + 2), 4.2))
    for i, s in enumerate(strategies):
        ys = [sp.get((m, s, target), sp.get((m, s, f"{target} (predicted)"), np.nan))
              for m in models]
        ax.bar(np.arange(len(models)) + (i - (len(strategies) - 1) / 2) * width, ys, width,
               label=s)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(np.arange(len(models)), models, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"speedup vs {baseline} ({'predicted' if predicted else 'measured'})")
    ax.set_title(f"{target}: {'predicted' if predicted else 'measured'} speedup over {baseline}")
    ax.legend(fontsize=8, ncol=min(5, len(strategies)))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)


def plot_registers(cells: Sequence[Cell], path: str | os.PathLike,
                   target: str = "cuda") -> str | None:
    """Registers per kernel (ptxas), one panel per model, one column of points per strategy;
    spilling kernels in red."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chosen = [c for c in cells if c.target == target and c.ok
              and any(k.registers is not None for k in c.kernel_regs)]
    if not chosen:
        return None
    models = list(dict.fromkeys(c.model for c in chosen))
    strategies = list(dict.fromkeys(c.strategy for c in chosen))
    cols = min(5, len(models))
    rows = math.ceil(len(models) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols + 0.6, 2.6 * rows + 0.4),
                             squeeze=False, sharey=True)
    rng = np.random.default_rng(0)  # jitter only; fixed so plots are reproducible
    for ax, m in zip(axes.flat, models, strict=False):
        for i, s in enumerate(strategies):
            c = next((c for c in chosen if c.model == m and c.strategy == s), None)
            if c is None:
                continue
            regs = [(k.registers, k.spill_bytes) for k in c.kernel_regs if k.registers is not None]
            xs = i + rng.uniform(-0.18, 0.18, len(regs))
            colours = ["tab:red" if sb > 0 else "tab:blue" for _, sb in regs]
            ax.scatter(xs, [r for r, _ in regs], s=9, c=colours, alpha=0.7)
        ax.set_title(m, fontsize=9)
        ax.set_xticks(range(len(strategies)), strategies, rotation=45, ha="right", fontsize=7)
        ax.axhline(255, color="0.6", lw=0.6, ls="--")
    for ax in list(axes.flat)[len(models):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("registers / thread", fontsize=8)
    fig.suptitle(f"{target}: ptxas registers per kernel (red: spills)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)


def plot_bench(rows: Sequence[dict], threads: Sequence[int], path: str | os.PathLike,
               num: str, columns: Sequence[str]) -> str | None:
    """Grouped bars: ``num``'s speedup over each of ``columns`` per model and thread count
    (``costfuse bench`` rows; a missing or WRONG column is no bar, a busy row is labelled);
    None, and no file, where no column has a ratio to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .bench import disturbed, speedup

    groups = [(r, t) for r in rows if "error" not in r for t in threads]
    bars = {c: [speedup(r, num, c, t) for r, t in groups] for c in columns if c != num}
    bars = {c: ys for c, ys in bars.items() if any(y is not None for y in ys)}
    if not bars:
        return None
    width = 0.8 / max(1, len(bars))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(groups) * len(bars) + 2), 4.2))
    for i, (den, ys) in enumerate(bars.items()):
        ax.bar(np.arange(len(groups)) + (i - (len(bars) - 1) / 2) * width,
               [np.nan if y is None else y for y in ys], width, label=den)
    ax.axhline(1.0, color="k", lw=0.8)
    labels = [f"{r['model']}{' (busy)' if disturbed(r) else ''} @{t}" for r, t in groups]
    ax.set_xticks(np.arange(len(groups)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"column ms / {num} ms (> 1: {num} faster)")
    ax.set_title(f"measured speedup of {num} over each column", fontsize=10)
    ax.legend(fontsize=8, ncol=min(5, max(1, len(bars))))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return str(path)
