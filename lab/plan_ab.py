"""A/B of a planning choice end to end: CostFuse as the code stands ("new") against CostFuse
with module attributes set otherwise in-process ("old"), and FuseOps, interleaved.

Each ``--old MODULE.ATTR=EXPR`` sets one attribute (EXPR is Python, evaluated once) while the
"old" variant is planned and compiled, then restores it; the efficiency cache
(``schedules.efficiency.fraction_of_peak``) is cleared around it, so constants it reads take
effect. Outputs of both CostFuse builds are compared with FuseOps'. Host description as the
pipeline finds it (calibrated unless ``TVM_COSTFUSE_CALIBRATION=none``)::

    python lab/plan_ab.py --models bert vit_b_16 --threads 1 --repeat 5 \\
        --old tvm_costfuse.schedules.efficiency.E_ACTIVATION=1.0

(``MODULE.OBJECT.ATTR`` sets an object's attribute, a frozen card's field among them.)

``--builds N`` compiles each variant N times and times every build in the same interleaved
rounds: two builds of one plan in one process can differ by 2% on a decode step, once by 18%
(docs/log/2026-12-06g.md, 2026-12-06h.md), so a variant's time is the median of its builds'
medians, and the spread between its fastest and slowest build is printed beside it. At 2+
threads, the rounds in which a sample was taken with the CPUs apart are left out
(``time_builds``; ``apart=`` says how many samples).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from contextlib import contextmanager

import numpy as np
import tvm

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from tvm_costfuse.measurement.peers import thread_pool as _thread_pool  # noqa: E402
from tvm_costfuse.measurement.peers import time_builds  # noqa: E402

from tvm_costfuse import host_target, strategy_pipeline, tir_pipeline  # noqa: E402
from tvm_costfuse.measurement.timing import run  # noqa: E402
from tvm_costfuse.models import corpus  # noqa: E402
from tvm_costfuse.schedules.efficiency import fraction_of_peak  # noqa: E402


def _parse(spec: str):
    """(owner, attribute, value) of ``MODULE[.OBJECT...].ATTR=EXPR``: the longest importable
    prefix is the module, the rest a path of attributes (a card's field, say)."""
    target, expr = spec.split("=", 1)
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:-1]:
            owner = getattr(owner, name)
        return owner, parts[-1], eval(expr)  # a research flag, typed by hand
    raise SystemExit(f"--old {spec}: no importable module in {target}")


def _set(owner, attr, value) -> None:
    """setattr, also on a frozen dataclass (a card)."""
    try:
        setattr(owner, attr, value)
    except AttributeError:  # dataclasses.FrozenInstanceError
        object.__setattr__(owner, attr, value)


@contextmanager
def overridden(settings):
    saved = [(m, a, getattr(m, a)) for m, a, _ in settings]
    for m, a, value in settings:
        _set(m, a, value)
    fraction_of_peak.cache_clear()
    try:
        yield
    finally:
        for m, a, value in saved:
            _set(m, a, value)
        fraction_of_peak.cache_clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--builds", type=int, default=1, help="compilations per variant")
    ap.add_argument("--old", action="append", required=True, metavar="MODULE[.OBJECT].ATTR=EXPR")
    args = ap.parse_args()
    settings = [_parse(s) for s in args.old]
    for name in args.models:
        mod, inputs, _ = corpus.load(name)
        target = host_target(args.threads)
        _thread_pool(args.threads)
        kernels, outs = {}, {}
        variants = (("old", "costfuse"), ("new", "costfuse"), ("tvm", "tvm"))
        builds: dict[str, list] = {label: [] for label, _ in variants}
        for i in range(args.builds):
            for label, strategy in variants if i % 2 == 0 else variants[::-1]:
                def build():
                    return tvm.compile(mod, target=target,
                                       relax_pipeline=strategy_pipeline(strategy, target),
                                       tir_pipeline=tir_pipeline())
                if label == "old":
                    with overridden(settings):
                        ex = build()
                else:
                    ex = build()
                calls: list = []
                outs[f"{label}#{i}"] = run(ex, inputs, calls=calls)[0]
                kernels[label] = len(calls)
                builds[label].append(ex)
        ref = outs["tvm#0"]
        scale = max(1e-30, float(np.abs(ref).max()))
        err = {label: max(float(np.abs(outs[f"{label}#{i}"] - ref).max()) / scale
                          for i in range(args.builds)) for label, _ in variants}
        dropped: list[int] = []
        per_build, load = time_builds(builds, inputs, args.threads, args.repeat, dropped)
        ms = {k: float(np.median(v)) for k, v in per_build.items()}
        spread = {k: max(v) / min(v) for k, v in per_build.items()}
        print(f"{name} threads={args.threads} builds={args.builds} load={load:.2f} "
              f"apart={dropped[0]}/{args.repeat * sum(map(len, builds.values()))} "
              f"kernels={kernels} "
              + " ".join(f"{k}={v:.2f}ms" for k, v in ms.items())
              + " build spread " + " ".join(f"{k}={v:.3f}" for k, v in spread.items())
              + f" new/old speed={ms['old'] / ms['new']:.3f}"
              f" new vs FuseOps={ms['tvm'] / ms['new']:.3f}"
              f" max rel err vs FuseOps old={err['old']:.1e} new={err['new']:.1e}", flush=True)


if __name__ == "__main__":
    main()
