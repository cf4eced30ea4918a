"""The regret rows (``report.regret``) said: the clear regions' decisions next to always and
never fuse, one summary line per thread count, and the markdown tables."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..measurement.timing import geomean
from .bench import DISTURBED_CORES
from .regret_plans import FUSEOPS, Region

__all__ = ["accuracy", "summary", "table"]


def accuracy(regions: Sequence[tuple[Region, float]]) -> dict[str, float]:
    """On the clear regions of (region, CostFuse's ms in its round) pairs: how many, the share
    where CostFuse's side was measured faster, and over those whose sides differ in kernel
    count ("sided"), the share where the side with fewer kernels (always fuse) and with more
    (never fuse) was."""
    clear = [(r, base) for r, base in regions if r.clear and r.flipped_ms is not None]
    if not clear:
        return {"clear": 0}
    ours_faster = np.array([r.flipped_ms > base for r, base in clear])
    # +1 where CostFuse's side has fewer kernels, -1 more, 0 as many (neither baseline's pick)
    side = np.sign(np.array([len(r.theirs) - len(r.ours) for r, _ in clear]))
    fewer_faster = np.where(ours_faster, side, -side)[side != 0] > 0
    out = {"clear": len(clear), "costfuse": float(np.mean(ours_faster)),
           "sided": int(fewer_faster.size)}
    if fewer_faster.size:
        out["always fuse"] = float(np.mean(fewer_faster))
        out["never fuse"] = 1.0 - out["always fuse"]
    return out


def summary(rows: Sequence[dict], threads: Sequence[int]) -> list[str]:
    """One line per thread count: regret geomean and worst, and the clear regions' accuracy."""
    lines = []
    for t in threads:
        at = [r for r in rows if "error" not in r and r["threads"] == t]
        if not at:
            continue
        worst = max(at, key=lambda r: r["regret"])
        acc = accuracy([(reg, r["costfuse_ms_round1"]) for r in at for reg in r["regions"]])
        shares = ", ".join(f"{k} {acc[k]:.2f}" for k in ("costfuse", "always fuse", "never fuse")
                           if k in acc)
        sided = (f" ({acc['sided']} with sides of unequal kernel counts): right {shares}"
                 if shares else "")
        again = (", again on fresh builds" if any(reg.replicated is not None for r in at
                                                   for reg in r["regions"]) else "")
        lines.append(f"- {t} thread(s): regret geomean {geomean([r['regret'] for r in at]):.3f},"
                     f" worst {worst['regret']:.3f} ({worst['model']}); {acc['clear']} regions "
                     f"clear of their row's rebuild band{again}{sided}")
    return lines


def _fresh(r: Region) -> str:
    """The region's ratio on fresh builds, or why it has none though round 1 timed it."""
    if r.flipped_ms is not None and r.unbuilt:
        return r.unbuilt
    return "-" if r.replicated is None else f"{r.replicated:.3f}"


def table(rows: Sequence[dict]) -> str:
    """Markdown: per model and thread count the whole plans' times and the regret; then per
    region its kernels, predicted and measured effect."""
    head = ("| model | threads | none ms | FuseOps' groups ms | CostFuse ms | best flip ms | "
            "faster flips ms (combined, left out) | round 2 fastest | CostFuse / it | fresh "
            "builds: CostFuse / rival (90%) | regret | best | rebuild band | regions (clear) | "
            "max err | other load (rounds) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | {row.get('threads', '')} |" + " |" * 13
                         + f" FAILED: {row['error']} |")
            continue

        def cell(k: str, ms=row["ms"]) -> str:
            return f"{ms[k]:.3f}" if k in ms else "-"

        n_clear = sum(r.clear for r in row["regions"])
        conf = row.get("confirmed")
        load = (*row["other_load"], *((conf["other_load"],) if conf else ()))
        busy = " (busy)" if np.nanmax([*load, 0.0]) > DISTURBED_CORES else ""  # NaN: unread
        fresh = (f"{conf['rival']}: {conf['ratio']:.3f} ({conf['interval'][0]:.3f}-"
                 f"{conf['interval'][1]:.3f})" if conf else "-")
        lines.append(
            f"| {row['model']}{busy} | {row['threads']} | {cell('none')} | {cell(FUSEOPS)} | "
            f"{cell('costfuse')} | {cell('best flip')} | {cell('faster flips')} "
            f"({row['combined']}, {row['left_out']}) | {row['pick']} | "
            f"{row['ms']['costfuse'] / row['ms'][row['pick']]:.3f} | {fresh} | "
            f"{row['regret']:.3f} | {row['best']} | {row['band']:.3f} | "
            f"{len(row['regions'])} ({n_clear}) | {row['max_err']:.1e} | "
            + " / ".join(f"{x:.2f}" for x in load) + " |")
    lines += ["", ("| model | threads | where | ops | CostFuse's kernels | FuseOps' kernels | "
                   "predicted us (ours / theirs) | flipped / CostFuse (round 1) | fresh "
                   "builds | clear |"),
              "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        for r in row.get("regions", ()):
            ratio = (f"{r.flipped_ms / row['costfuse_ms_round1']:.3f}"
                     if r.flipped_ms is not None else f"not timed: {r.unbuilt}")
            lines.append(f"| {row['model']} | {row['threads']} | {r.where} | {r.ops} | "
                         f"{' + '.join(r.ours)} | {' + '.join(r.theirs)} | "
                         f"{r.predicted_us[0]:.1f} / {r.predicted_us[1]:.1f} | {ratio} | "
                         f"{_fresh(r)} | "
                         f"{'yes' if r.clear else 'no'} |")
    return "\n".join(lines)
