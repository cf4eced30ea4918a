"""How a flip's effect is read against the noise of builds: paired ratios and the rebuild band.

A flip (the model with one region grouped otherwise) is another compilation, so its time
differs from CostFuse's plan by the region's effect and by the build's own draw; these two
functions are the measure of both that ``report.regret`` and ``report.replicate`` share.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["paired_ratio", "rebuild_band"]


def rebuild_band(builds_ms: Sequence[float]) -> float:
    """How far apart builds of one plan ran: the slowest build's median over the fastest's,
    less 1 (0 for one build). A flip's ratio compares two builds, so its build draws alone may
    move it that far; from a few builds this is still an under-estimate of the range."""
    return max(builds_ms) / min(builds_ms) - 1.0


def paired_ratio(flip: Sequence[float], base: Sequence[float], margin: float = 0.01
                 ) -> tuple[float, bool]:
    """(median over rounds of flip / the base sample taken just before it, whether that ratio
    is clear of 1): clear when its interquartile range stays outside ``1 +- margin``. Paired
    samples cancel the drift of a shared host between rounds, and a base sample that was slow
    by chance moves one ratio, not every region's verdict (as one median base would)."""
    r = np.asarray(flip) / np.asarray(base)
    q1, q2, q3 = np.percentile(r, [25, 50, 75])
    return float(q2), bool(q1 > 1.0 + margin or q3 < 1.0 - margin)
