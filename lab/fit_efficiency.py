"""Fit ``schedules/efficiency.py``'s constants (K0, E_PATH) to measured kernels; print the fit.

The measured share of the FMA-chain peak per kernel is ``scripts/bench_kernels.py --peak``'s
``tvm/peak`` column on znver4 (1 thread, 2026-12-06, kernels with their register tiles on the
stack; docs/log/2026-12-06g.md). The module's constants are this fit (E_PATH["gemm"] held at
1.0; measured end to end and landed, docs/log/2026-12-06h.md). Here the built-in GEMMs read as
activation GEMMs (their weights are not constants in ``bench_kernels``' modules), so
``E_ACTIVATION`` enters their fit. The
geometry of each kernel is read the way the cost model reads it (``graph.build_graph`` on the prepared module), so the
fit sees exactly what the planner will. Prints each kernel's predicted and measured share, the
fitted constants, and how far the single contraction share (0.55, now the contraction card's fallback) was from
the same figures.

``--gemm-only`` fits the GEMM micro-kernel's own ``K0_GEMM`` and ``E_PATH["gemm"]`` with the
other paths held at the module's constants (the depthwise figures were fitted on ``K0``); it
adds the corpus's pointwise convolutions (``POINTWISE``, on the merged-column kernel).

    python lab/fit_efficiency.py [--lanes 16 --registers 32] [--gemm-only]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from bench_kernels import CASES, Conv, conv_module, relax_module  # noqa: E402

from tvm_costfuse.graph import build_graph  # noqa: E402
from tvm_costfuse.pipelines import prepare  # noqa: E402
from tvm_costfuse.schedules import efficiency  # noqa: E402

# tvm/peak per kernel: ``scripts/bench_kernels.py --threads 1 --repeat 5 --peak --classes
# contraction`` on znver4, 2026-12-06 18:53 UTC, kernels with their register tiles on the stack
# (docs/log/2026-12-06g.md; FMA-chain peak 117.3 GFLOP/s). The emeraldrapids figures of
# 2026-12-01 (docs/log/2026-12-01a.md), taken with a workspace call per tile, are in git history.
MEASURED = {
    "linear_197x384x1536": 0.98, "vit_qkv_197x768x2304": 0.97, "vit_fc1_197x768x3072": 0.96,
    "vit_fc2_197x3072x768": 0.96, "vit_qkT_12x197x64x197": 0.69, "vit_pv_12x197x197x64": 0.90,
    "bert_qkT_12x128x64x128": 0.90, "bcast_b_12x197x64x64": 0.90,
    "r50_conv1x1_64x56x56_to256": 0.93, "r50_conv1x1_256x14x14_to1024": 0.95,
    "r50_conv3x3_64x56x56": 0.96, "r50_stem7x7_s2_3x224x224": 0.77,
    "r50_conv3x3_128x28x28": 0.97, "r50_conv3x3_256x14x14": 0.99, "r50_conv3x3_512x7x7": 0.97,
    "r50_conv3x3_128x56x56_s2": 0.94, "rx50_g32_3x3_128x56x56": 0.57,
    "rx50_g32_3x3_512x14x14": 0.89, "inc_1x7_128x17x17": 0.91, "inc_7x1_128x17x17_to192": 0.97,
    "inc_3x3_64x35x35_to96": 0.97, "inc_stem3x3_32x147x147_to64": 0.93,
    "inc_stem3x3_80x73x73_to192": 0.91, "w2v_conv1d_k10s5_1x16000": 0.51,
    "w2v_conv1d_k3s2_512x3199": 0.89, "w2v_conv1d_k3s2_512x199": 0.94,
    "w2v_conv1d_k2s2_512x99": 0.97, "w2v_posconv_k128g16_768x49": 0.98,
}

# tvm/peak of mobilenet_v2's 1x1 convolutions that take the GEMM kernel with merged columns,
# (in channels, out channels, height = width): ``bench_kernels.py --peak --no-builtin
# --convs-from-corpus mobilenet_v2``, same host and hour.
POINTWISE = {(32, 16, 112): 0.91, (16, 96, 112): 0.89, (96, 24, 56): 0.96, (24, 144, 56): 0.95,
             (144, 24, 56): 0.97, (144, 32, 28): 0.98, (32, 192, 28): 0.92,
             (192, 32, 28): 0.98, (192, 64, 14): 0.86, (64, 384, 14): 0.85,
             (384, 96, 14): 0.90, (96, 576, 14): 0.89, (576, 96, 14): 0.91,
             (576, 160, 7): 0.92, (160, 960, 7): 0.92, (960, 160, 7): 0.94,
             (320, 1280, 7): 0.95}


def _geometry(mod, name) -> tuple:
    graph = build_graph(prepare(mod, {"kind": "llvm"}))
    geoms = [n.geometry for n in graph.nodes if n.geometry is not None]
    if len(geoms) != 1:
        raise SystemExit(f"{name}: {len(geoms)} contraction geometries, expected 1")
    return geoms[0]


def pointwise() -> tuple[dict[str, tuple], dict[str, float]]:
    rng = np.random.default_rng(0)
    geoms, measured = {}, {}
    for (cin, cout, hw), share in POINTWISE.items():
        name = f"pointwise_{cin}x{hw}x{hw}_to{cout}"
        case = Conv(name, (1, cin, hw, hw), (cout, cin, 1, 1), 1, (0, 0), 1)
        geoms[name], measured[name] = _geometry(conv_module(case, rng)[0], name), share
    return geoms, measured


def geometries() -> dict[str, tuple]:
    rng = np.random.default_rng(0)
    out = {}
    for case in CASES:
        if case.name not in MEASURED:
            continue
        mod = (conv_module if isinstance(case, Conv) else relax_module)(case, rng)[0]
        out[case.name] = _geometry(mod, case.name)
    return out


def predict(geom, lanes, registers, k0, e_path, k0_gemm=None) -> tuple[str, float]:
    path, share = efficiency.fraction_of_peak.__wrapped__(geom, lanes, registers)
    # undo the module's constants, apply the trial ones
    k = geom[0]
    raw = share / efficiency.E_PATH[path] / (k / (k + efficiency.k0_of(path)))
    if path == "gemm" and k0_gemm is not None:
        k0 = k0_gemm
    return path, e_path[path] * raw * k / (k + k0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lanes", type=int, default=16)
    ap.add_argument("--registers", type=int, default=32)
    ap.add_argument("--gemm-only", action="store_true", help="fit K0_GEMM, E_PATH['gemm']")
    args = ap.parse_args()
    geoms, measured = geometries(), dict(MEASURED)
    if args.gemm_only:
        extra, extra_measured = pointwise()
        geoms.update(extra)
        measured.update(extra_measured)
    names = list(geoms)
    paths = sorted({efficiency.fraction_of_peak(geoms[n], args.lanes, args.registers)[0]
                    for n in names})

    def unpack(x):
        if args.gemm_only:
            return efficiency.K0, {**efficiency.E_PATH, "gemm": x[1]}, x[0]
        return x[0], dict(zip(paths, x[1:], strict=True)), None

    def loss(x):
        k0, e, k0_gemm = unpack(x)
        return sum(math.log(predict(geoms[n], args.lanes, args.registers, k0, e, k0_gemm)[1]
                            / measured[n]) ** 2 for n in names
                   if not args.gemm_only or efficiency.fraction_of_peak(
                       geoms[n], args.lanes, args.registers)[0] == "gemm")

    start = ([efficiency.K0_GEMM, efficiency.E_PATH["gemm"]] if args.gemm_only
             else [efficiency.K0] + [efficiency.E_PATH[p] for p in paths])
    fit = minimize(loss, start, method="Nelder-Mead", options={"xatol": 1e-3, "maxiter": 4000})
    k0, e, k0_gemm = unpack(fit.x)
    print(f"{'kernel':32s} {'path':5s} {'K':>6s} {'measured':>8s} {'module':>7s} "
          f"{'fitted':>7s} {'const':>6s}")
    errs = {"module": [], "fitted": [], "const": []}
    for n in names:
        path, mod_share = efficiency.fraction_of_peak(geoms[n], args.lanes, args.registers)
        fitted = predict(geoms[n], args.lanes, args.registers, k0, e, k0_gemm)[1]
        print(f"{n:32s} {path:5s} {geoms[n][0]:6d} {measured[n]:8.2f} {mod_share:7.2f} "
              f"{fitted:7.2f} {0.55:6.2f}")
        for key, v in (("module", mod_share), ("fitted", fitted), ("const", 0.55)):
            errs[key].append(abs(math.log(v / measured[n])))
    gemm_k0 = f", K0_GEMM = {k0_gemm:.1f}" if k0_gemm is not None else ""
    print(f"fitted: K0 = {k0:.1f}{gemm_k0}, " + ", ".join(f"E_PATH[{p!r}] = {v:.2f}"
                                                           for p, v in e.items()))
    for key, v in errs.items():
        ratios = np.exp(v)
        print(f"{key:7s}: median |pred/meas| {np.median(ratios):.2f}x, "
              f"p90 {np.percentile(ratios, 90):.2f}x, worst {ratios.max():.2f}x")


if __name__ == "__main__":
    main()
