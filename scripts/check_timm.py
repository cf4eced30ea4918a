"""Numerics of timm models outside the corpus under none / tvm / costfuse, against PyTorch.

    python scripts/check_timm.py mobileone_s0 repghostnet_050 repvgg_a0 [--size 96]

Random weights with non-trivial batch-norm statistics (a fresh BN is the identity and hides
epilogue bugs); one line per model and strategy: max |ours - torch| / max |torch|.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import tvm

from tvm_costfuse.measurement.timing import run
from tvm_costfuse.models import load_torch
from tvm_costfuse.models.corpus_vision import import_torchvision
from tvm_costfuse.strategies import strategy_pipeline, tir_pipeline
from tvm_costfuse.targets import host_target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+", help="timm model names")
    ap.add_argument("--size", type=int, default=96, help="input image side")
    args = ap.parse_args()
    import_torchvision()  # timm imports torchvision, whose C++ ops need not load here
    import timm

    torch.manual_seed(0)
    target = host_target()
    for name in args.models:
        net = timm.create_model(name, pretrained=False).eval()
        with torch.no_grad():
            for m in net.modules():
                if isinstance(m, torch.nn.BatchNorm2d):
                    m.running_mean.uniform_(-0.5, 0.5)
                    m.running_var.uniform_(0.5, 2.0)
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.2, 0.2)
            x = torch.randn(1, 3, args.size, args.size)
            want = net(x).numpy()
        mod, inputs = load_torch(net, (x,))
        for strategy in ("none", "tvm", "costfuse"):
            ex = tvm.compile(mod, target, relax_pipeline=strategy_pipeline(strategy, target),
                             tir_pipeline=tir_pipeline(strategy))
            got = run(ex, inputs)[0]
            err = float(np.abs(got - want).max() / np.abs(want).max())
            print(f"{name:<20} {strategy:<9} {err:.2e}", flush=True)


if __name__ == "__main__":
    main()
