"""Vectorized math on and off, side by side, next to PyTorch eager at the same threads.

Why: ``schedules/fast_math`` replaces scalar libm exp/log/tanh/sigmoid/erf calls in every CPU
kernel. This compiles each model with each strategy twice, with the rewrite
(``schedule_pass(fast_math=True)``, the default) and without it, checks every build against
TVM's stock build, and times all builds and PyTorch eager (``scripts/torch_zoo.py``, same
weights, ``--cores`` threads) interleaved in one process; prints medians in ms.

    TVM_COSTFUSE_CALIBRATION=none python lab/fast_math_effect.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import tvm
from tvm import relax
from tvm_costfuse.schedules import schedule_pass

from tvm_costfuse import models
from tvm_costfuse.measurement.timing import (
    call_sampler,
    interleave,
    max_mismatch,
    run,
    vm_sampler,
)
from tvm_costfuse.pipelines import build_pipeline
from tvm_costfuse.strategies import fusion_pass
from tvm_costfuse.targets import host_target

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
try:
    import torch
    import torch_zoo
except ImportError:  # torch is an optional extra
    torch = None

_SAMPLE_MS = 50


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["elementwise_chain", "mlp_gelu", "gpt2_block"])
    ap.add_argument("--strategies", nargs="*", default=["tvm", "costfuse"])
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--small", action="store_true")
    args = ap.parse_args()
    target = host_target(args.cores)
    print(f"target {target}  small={args.small}  repeat={args.repeat}  "
          f"torch={torch.__version__ if torch else 'no'}")
    for name in args.models:
        mod, inputs = models.load(name, small=args.small)
        stock = run(tvm.compile(mod, target=target,
                                relax_pipeline=relax.get_default_pipeline(target)), inputs)
        samplers, errors = {}, {}
        for strategy in args.strategies:
            for fast in (False, True):
                key = f"{strategy}-{'vector' if fast else 'libm'}"
                ex = tvm.compile(mod, target=target, relax_pipeline=build_pipeline(
                    target, fusion_pass(strategy, target),
                    schedule_pass(target, fast_math=fast)))
                errors[key] = max_mismatch(stock, run(ex, inputs))
                samplers[key] = vm_sampler(ex, inputs, min_ms=_SAMPLE_MS)
        if torch is not None:
            fn, _ = torch_zoo.load(name, small=args.small)
            calls = call_sampler(fn, _SAMPLE_MS)

            def sample(calls=calls) -> float:
                torch.set_num_threads(args.cores)
                with torch.inference_mode():
                    return calls()

            samplers[f"torch{args.cores}"] = sample
        t = {k: float(np.median(v)) for k, v in interleave(samplers, args.repeat).items()}
        print(name, "  ".join(f"{k} {v * 1e3:.3f}" for k, v in t.items()),
              "| max mismatch vs stock (rtol 1e-4, atol 1e-5):",
              " ".join(f"{k} {v:.2g}" for k, v in errors.items()), flush=True)


if __name__ == "__main__":
    main()
