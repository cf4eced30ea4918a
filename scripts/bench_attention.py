"""The fused attention kernel against the split kernels and PyTorch, at equal threads.

For each case ``B,H,S,D,FORM[,ROWS]`` (FORM: plain, masked (BERT's additive padding mask),
causal (GPT-2's where); ROWS: query rows, when other than the S keys) the program of
``tvm_costfuse.testing.attention_program`` is built

- fused: one group (``schedules/attention.py``),
- split: ``[K^T] [Q K^T, scale, mask] [softmax] [P V]``, how the planner grouped it before,

both with our CPU schedules, checked against each other, and timed interleaved with PyTorch's
``scaled_dot_product_attention`` and its eager math at the same thread count.

    python scripts/bench_attention.py --threads 1 1,12,128,64,masked 1,12,197,64,plain
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import tvm
from tvm_costfuse.schedules import schedule_pass

from tvm_costfuse import build_graph
from tvm_costfuse.measurement.timing import call_sampler, interleave, run, vm_sampler
from tvm_costfuse.partition import ApplyPartition
from tvm_costfuse.pipelines import build_pipeline
from tvm_costfuse.strategies import tir_pipeline
from tvm_costfuse.targets import host_target
from tvm_costfuse.testing import attention_program


def _builds(mod, target):
    graph = build_graph(mod)
    calls = [n.name for n in graph.nodes if n.kind == "call_tir"]
    softmax = next(i for i, n in enumerate(calls) if graph[n].prim_func.startswith("softmax"))
    split = [calls[1:softmax]] if softmax > 2 else []

    def build(groups):
        return tvm.compile(mod, target, relax_pipeline=build_pipeline(
            target, ApplyPartition(groups), schedule_pass(target)), tir_pipeline=tir_pipeline())

    return build([calls]), build(split)


def _torch(inputs, form: str, d: int):
    q, k, v = (torch.from_numpy(inputs[n]) for n in "qkv")
    mask = None
    if form == "masked":
        mask = torch.from_numpy(inputs["mask"])
    elif form == "causal":
        rows, keys = q.shape[-2], k.shape[-2]  # as ``attention_program`` builds it
        mask = torch.where(torch.tril(torch.ones(rows, keys, dtype=torch.bool)), 0.0, -1e4)

    def sdpa():
        with torch.no_grad():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def eager():
        with torch.no_grad():
            scores = q @ k.transpose(-1, -2) / d ** 0.5
            return torch.softmax(scores if mask is None else scores + mask, -1) @ v

    return sdpa, eager


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", help="B,H,S,D,FORM[,ROWS]")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # TVM's pool starts at every CPU the process may use (``tvm_costfuse/__init__.py``);
    # the target's core count does not limit a parallel loop at run time.
    tvm.get_global_func("runtime.config_threadpool")(1, args.threads)
    target = host_target(args.threads)
    for case in args.cases:
        b, h, s, d, form, *rows = case.split(",")
        b, h, s, d = map(int, (b, h, s, d))
        mod, inputs = attention_program(b, h, s, d, form, rows=int(rows[0]) if rows else None)
        fused, split = _builds(mod, target)
        np.testing.assert_allclose(run(fused, inputs)[0], run(split, inputs)[0],
                                   rtol=1e-4, atol=1e-5)
        sdpa, eager = _torch(inputs, form, d)
        samples = interleave({"fused": vm_sampler(fused, inputs),
                              "split": vm_sampler(split, inputs),
                              "sdpa": call_sampler(sdpa), "eager": call_sampler(eager)},
                             args.repeat)
        med = {k: float(np.median(x)) * 1e6 for k, x in samples.items()}
        print(f"{case} threads={args.threads} "
              + " ".join(f"{k}={v:.1f}us" for k, v in med.items())
              + f" split/fused={med['split'] / med['fused']:.2f}", flush=True)


if __name__ == "__main__":
    main()
