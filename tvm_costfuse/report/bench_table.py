"""The table of ``costfuse bench``'s rows (:mod:`.bench`): one markdown row per model, then the
rows to rerun (busy, CPUs apart), the missing and wrong columns, and the geomeans."""

from __future__ import annotations

import math

from ..measurement.placement import apart
from ..measurement.timing import SCALED_TOLERANCE, geomean

__all__ = ["DISTURBED_CORES", "disturbed", "speedup", "table"]

# A row timed while other processes kept more than this many cores busy is marked: a 2-vCPU
# host's 2-thread figures moved 2x under a short script elsewhere.
DISTURBED_CORES = 0.1


def _apart_samples(rows: list[dict]) -> list[dict[str, tuple[int, int]]]:
    """Per row and thread count: (samples of ours taken apart, samples probed), against the
    fastest probe of all ``rows`` at that thread count (rows of one host's run: rows read back
    from another host's run would set another yardstick)."""
    fastest: dict[str, float] = {}
    for r in rows:
        for t, probes in r.get("probe_s", {}).items():
            if probes:
                fastest[t] = min(min(probes), fastest.get(t, math.inf))
    return [{t: (apart(p, fastest[t]), len(p)) for t, p in r.get("probe_s", {}).items() if p}
            for r in rows]


def _wrong(row: dict) -> set[str]:
    """The columns whose output missed the reference by more than ``SCALED_TOLERANCE``."""
    return {c for c, e in row.get("err", {}).items() if not e <= SCALED_TOLERANCE}


def disturbed(row: dict) -> bool:
    return max(row.get("other_load", {}).values(), default=math.nan) > DISTURBED_CORES


def speedup(row: dict, num: str, den: str, threads: int) -> float | None:
    """``den``'s ms over ``num``'s at ``threads`` (above 1: ``num`` is faster); None where
    either column is missing or WRONG."""
    a, b = f"{num}@{threads}", f"{den}@{threads}"
    if a not in row.get("ms", {}) or b not in row["ms"] or _wrong(row) & {a, b}:
        return None
    return row["ms"][b] / row["ms"][a]


def table(rows: list[dict], threads: list[int], ours, peers) -> str:
    """The rows as one markdown table, then the marked rows, missing columns and geomeans."""
    cols = [f"{c}@{t}" for t in threads for c in (*ours, *peers)]
    head = ["model", "family", *(f"k {s}" for s in ours), *(f"{c} ms" for c in cols), "max err",
            "other load"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    spread = _apart_samples(rows)
    for r, by_t in zip(rows, spread, strict=True):
        if "error" in r:
            lines.append(f"| {r['model']} | {r.get('family', '')} | failed: {r['error']} |")
            continue
        loads = r.get("other_load", {})
        load = " / ".join(f"{loads[t]:.2f}" for t in sorted(loads, key=int)) or "n/a"
        load += "".join(f"; apart {n}/{of} @{t}" for t, (n, of) in by_t.items() if n)
        load += "".join(f"; left out {n} round(s) @{t}"
                        for t, n in sorted(r.get("left_out", {}).items()))
        cells = [r["model"] + (" (busy)" if disturbed(r) else ""), r["family"],
                 *(str(r["kernels"].get(s, "-")) for s in ours),
                 *(("WRONG " if c in _wrong(r) else "") + f"{r['ms'][c]:.3g}"
                   if c in r["ms"] else "-" for c in cols),
                 f"{max(r['err'].values()):.1e}", load]
        lines.append("| " + " | ".join(cells) + " |")
    ok = [r for r in rows if "error" not in r]
    lines.append("")
    busy = [r["model"] for r in ok if disturbed(r)]
    if busy:
        lines.append(f"- busy (other processes used > {DISTURBED_CORES} cores while the row "
                     f"was timed; rerun on a quiet machine): {', '.join(busy)}")
    far = [r["model"] for r, by_t in zip(rows, spread, strict=True)
           if "error" not in r and any(n for n, _ in by_t.values())]
    if far:
        lines.append("- apart (samples of ours taken while the CPUs sat apart, a thread-pool "
                     "launch well over the run's fastest: `measurement/placement.py`; such "
                     f"samples can run 2x slower; rerun those cells): {', '.join(far)}")
    dropped = [r["model"] for r in ok if r.get("left_out")]
    if dropped:
        lines.append("- left out (whole rounds in which a sample of ours was taken with the "
                     "CPUs apart; the cells are medians of the other rounds): "
                     + ", ".join(dropped))
    for r in ok:
        for column, why in r.get("failed", {}).items():
            lines.append(f"- {r['model']}: no {column} column: {why}")
        for column in sorted(_wrong(r)):
            lines.append(f"- {r['model']}: {column} is WRONG: {r['err'][column]:.1e} of the "
                         f"output's scale from the reference (left out of the geomeans)")
    for t in threads:
        for num in [s for s in ours if s.startswith("costfuse")]:
            for den in [s for s in (*ours, *peers) if s != num and not s.startswith("costfuse")]:
                ratios = [x for r in ok if (x := speedup(r, num, den, t)) is not None]
                if ratios:
                    lines.append(f"- {t} thread(s): {num} speedup over {den}: geomean "
                                 f"{geomean(ratios):.2f}x, min {min(ratios):.2f}x "
                                 f"({len(ratios)} models)")
    return "\n".join(lines)
