"""A corpus model end to end with CostFuse, with and without the attention kernel's class.

"without" prices every group as if ``GroupFeatures.attention`` were False (the plans before the
attention rule); both builds use the same schedules, are checked against each other and timed
interleaved with PyTorch eager at the same thread count.

    python lab/attention_e2e.py bert --threads 1 [--small]
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import torch
import tvm

from tvm_costfuse.cost import features
from tvm_costfuse.measurement.timing import call_sampler, interleave, run, vm_sampler
from tvm_costfuse.models import corpus
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.strategies import strategy_pipeline
from tvm_costfuse.targets import host_target


def _build(mod, target, attention: bool):
    card_on = features.GroupFeatures.card_on

    def without(self, kind):
        return card_on(dataclasses.replace(self, attention=False) if self.attention
                       else self, kind)

    if not attention:
        features.GroupFeatures.card_on = without
    try:
        return tvm.compile(mod, target=target,
                           relax_pipeline=strategy_pipeline("costfuse", target))
    finally:
        features.GroupFeatures.card_on = card_on


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = host_target(args.threads)
    mod, inputs, module = corpus.load(args.model, small=args.small)
    mod = prepare(mod, target)
    builds = {"with": _build(mod, target, True), "without": _build(mod, target, False)}
    calls = {k: [] for k in builds}
    outs = [run(ex, inputs, calls=calls[k])[0] for k, ex in builds.items()]
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-5)
    args_t = corpus.torch_inputs(inputs)

    def eager():
        with torch.no_grad():
            return module(*args_t)

    samples = interleave({**{k: vm_sampler(ex, inputs) for k, ex in builds.items()},
                          "torch eager": call_sampler(eager)}, args.repeat)
    med = {k: float(np.median(v)) * 1e3 for k, v in samples.items()}
    print(f"{args.model}{' small' if args.small else ''} threads={args.threads} kernels "
          f"{len(calls['with'])} / {len(calls['without'])}; "
          + ", ".join(f"{k} {v:.3f} ms" for k, v in med.items())
          + f"; without / with {med['without'] / med['with']:.3f}")


if __name__ == "__main__":
    main()
