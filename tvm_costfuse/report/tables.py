"""Tables of compare cells: speedups, the markdown table, CSV files of cells and kernels."""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Sequence
from dataclasses import asdict

from .cells import CSV_FIELDS, Cell

__all__ = ["markdown_table", "speedups", "write_csv", "write_kernels_csv"]


def speedups(cells: Sequence[Cell], baseline: str = "tvm") -> dict[tuple[str, str, str], float]:
    """(model, strategy, target) -> baseline time / time: measured where both cells were
    measured, else predicted (keys of predicted ones end in target + " (predicted)")."""
    by = {(c.model, c.strategy, c.target): c for c in cells if c.ok}
    out = {}
    for (m, s, t), c in by.items():
        b = by.get((m, baseline, t))
        if b is None:
            continue
        if c.measured_s and b.measured_s:
            out[(m, s, t)] = b.measured_s / c.measured_s
        elif c.predicted_s and b.predicted_s:
            out[(m, s, f"{t} (predicted)")] = b.predicted_s / c.predicted_s
    return out


def _fmt(value, scale: float = 1.0, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, int) and scale == 1.0:
        return str(value)
    return f"{value * scale:.{digits}g}" if abs(value * scale) < 1e4 else f"{value * scale:.0f}"


def markdown_table(cells: Sequence[Cell], baseline: str = "tvm") -> str:
    """One row per cell: kernels, intermediate MiB, predicted / measured / roofline ms,
    speedup vs ``baseline`` (``p`` marks a predicted one), registers, spills, numerics."""
    sp = speedups(cells, baseline)
    head = ("| model | target | strategy | kernels | interm. MiB | pred. ms | meas. ms | "
            f"x vs {baseline} | roofline ms | roofline frac | max regs | spilling kernels | "
            "spill B | numerics | error |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for c in cells:
        s = sp.get((c.model, c.strategy, c.target))
        x = f"{s:.2f}" if s else ""
        if not x and (p := sp.get((c.model, c.strategy, f"{c.target} (predicted)"))):
            x = f"{p:.2f} p"
        mib = c.intermediate_bytes / 2**20 if c.intermediate_bytes is not None else None
        row = [c.model, c.target, c.strategy, _fmt(c.kernels), _fmt(mib), _fmt(c.predicted_s, 1e3),
               _fmt(c.measured_s, 1e3), x, _fmt(c.roofline_s, 1e3),
               _fmt(c.roofline_fraction, 1.0, 2), _fmt(c.max_registers), _fmt(c.spilling_kernels),
               _fmt(c.spill_bytes), c.numerics,
               ("FAILED: " + c.error.replace("|", "/")) if c.error else ""]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def write_csv(cells: Sequence[Cell], path: str | os.PathLike) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, lineterminator="\n")
        w.writeheader()
        for c in cells:
            d = asdict(c)
            d.pop("kernel_regs")
            w.writerow(d)


def write_kernels_csv(cells: Sequence[Cell], path: str | os.PathLike) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["model", "strategy", "target", "kernel", "registers", "spill_bytes"])
        for c in cells:
            for k in c.kernel_regs:
                w.writerow([c.model, c.strategy, c.target, k.kernel,
                            "" if k.registers is None else k.registers, k.spill_bytes])
