"""Fit the two polynomials of ``schedules/fast_math.fast_erf`` and print them.

Why: erf has no short Cephes single-precision form that reaches a few ulp over its whole range,
so the coefficients are fitted here: near zero ``erf(x)/x - 1`` as a polynomial in x^2
(relative error), away from zero ``erfc(x)`` as a polynomial in ``x - mid`` (absolute error:
there erf is ``1 - erfc`` and its ulp is fixed by the 1, so erfc needs no relative accuracy and
no exp). Iteratively reweighted least squares
on Chebyshev nodes approaches the minimax fit; the script prints each fit's error in float64
and the float32 coefficients to paste. The float32 kernel's own error is what
``tests/test_fast_math.py`` measures.

    python lab/fit_erf.py
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy.special import erf, erfc


def fit(fun, weight, lo: float, hi: float, degree: int, nodes: int = 4000):
    """Coefficients (lowest first) of the polynomial nearest ``fun`` in ``weight``-ed max norm."""
    k = np.arange(nodes)
    t = (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (k + 0.5) / nodes)
    vander = np.vander(t, degree + 1, increasing=True)
    y, w = fun(t), weight(t)
    emphasis = np.ones_like(t)
    for _ in range(60):
        coeffs, *_ = np.linalg.lstsq(vander * (w * emphasis)[:, None], y * w * emphasis,
                                     rcond=None)
        err = np.abs((vander @ coeffs - y) * w)
        emphasis = emphasis * (err / err.max()) ** 0.3 + 1e-12
    return coeffs, float(err.max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", type=float, default=1.0, help="|x| where the two fits meet")
    ap.add_argument("--one", type=float, default=3.92, help="|x| from which erf rounds to 1")
    ap.add_argument("--near-degree", type=int, default=5)
    ap.add_argument("--far-degree", type=int, default=12)
    args = ap.parse_args()
    mid = round((args.split + args.one) / 2, 3)
    near, near_err = fit(lambda z: erf(np.sqrt(z)) / np.sqrt(z) - 1.0,
                         lambda z: np.sqrt(z) / erf(np.sqrt(z)), 1e-12, args.split ** 2,
                         args.near_degree)
    far, far_err = fit(lambda u: erfc(u + mid), np.ones_like, args.split - mid,
                       args.one - mid, args.far_degree)
    print(f"near: relative error {near_err:.2e}")
    print("_ERF_P =", tuple(float(np.float32(c)) for c in near))
    print(f"far (mid {mid}): absolute error of erfc {far_err:.2e}")
    print("_ERF_Q =", tuple(float(np.float32(c)) for c in far))


if __name__ == "__main__":
    main()
