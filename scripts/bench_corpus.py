"""Corpus benchmark: our strategies next to the peers a user would pick, at equal threads.

Per corpus model and thread count ``t``, in one process with interleaved timing rounds
(``timing.interleave``: every column sampled once per round, so a shared machine's drift hits
all alike): kernels launched and ms under ``none``, ``tvm`` (FuseOps) and ``costfuse`` (same
schedules, built with ``num-cores = t`` and TVM's thread pool sized ``t``), PyTorch eager with
``torch.set_num_threads(t)``, and ONNX Runtime (CPU provider, ``intra_op_num_threads = t``) on
the model exported with ``torch.onnx.export``. Every column's output is checked against
PyTorch's (max |ours - torch| / max |torch|). Geomean rows close the table.

    python scripts/bench_corpus.py [--models resnet50 bert ...] [--small] [--threads 1 2]
                                   [--repeat 5] [--no-ort] [--out table.md] [--rows rows.jsonl]

Run it on a quiet machine: PyTorch and ORT at 2 threads are erratic when anything else runs.
Each row records the cores other processes used while it was timed (``measurement.quiet``);
rows above ``DISTURBED_CORES`` are named under the table, to be rerun.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from collections.abc import Callable

import numpy as np
import tvm

from tvm_costfuse import host_target, strategy_pipeline
from tvm_costfuse.measurement.quiet import OtherLoad
from tvm_costfuse.measurement.timing import (
    call_sampler,
    geomean,
    interleave,
    run,
    vm_sampler,
)
from tvm_costfuse.models import corpus

OURS = ("none", "tvm", "costfuse")
_SAMPLE_MS = 50
# A row timed while other processes kept more than this many cores busy is flagged: a 2-vCPU
# host's 2-thread figures moved 2x under a short script elsewhere.
DISTURBED_CORES = 0.1


def _thread_pool(threads: int) -> None:
    tvm.get_global_func("runtime.config_threadpool")(1, threads)


def _with_threads(sample: Callable[[], float], threads: int) -> Callable[[], float]:
    """A TVM sampler run with the thread pool sized ``threads`` (the pool is process-wide)."""

    def timed() -> float:
        _thread_pool(threads)
        return sample()

    return timed


def _torch_sampler(module, args, threads: int) -> Callable[[], float]:
    import torch

    calls = call_sampler(lambda: module(*args), _SAMPLE_MS)

    def sample() -> float:
        torch.set_num_threads(threads)
        with torch.inference_mode():
            return calls()

    return sample


def _ort_session(module, args, names: list[str], threads: int, path: str):
    import onnxruntime as ort
    import torch

    if not os.path.exists(path):
        # nn.MultiheadAttention's inference fast path is one fused op that has no ONNX export;
        # off, the layer exports as its plain ops (eager keeps the fast path for its column).
        fastpath = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            with torch.no_grad():
                torch.onnx.export(module, args, path, input_names=names, opset_version=17,
                                  dynamo=False)
        finally:
            torch.backends.mha.set_fastpath_enabled(fastpath)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    return ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


def _scale_error(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| relative to the reference's scale."""
    return float(np.max(np.abs(got - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


def _first_output(out) -> np.ndarray:
    import torch

    while isinstance(out, (tuple, list)):
        out = out[0]
    if isinstance(out, torch.Tensor):
        return out.detach().numpy()
    return np.asarray(out)


def bench_model(name: str, small: bool, threads: list[int], repeat: int, with_ort: bool,
                tmp: str, ours: tuple[str, ...] = OURS) -> dict:
    """One model's row: kernels per strategy, and per thread count ms and error per column."""
    import torch

    mod, inputs, module = corpus.load(name, small=small)
    args = corpus.torch_inputs(inputs)
    with torch.inference_mode():
        ref = _first_output(module(*args))
    row: dict = {"model": name, "family": corpus.family(name), "kernels": {}, "ms": {},
                 "failed": {}, "err": {}, "other_load": {}}
    onnx_path = os.path.join(tmp, f"{name}.onnx")
    for t in threads:
        target = host_target(t)
        _thread_pool(t)
        samplers: dict[str, Callable[[], float]] = {}
        for s in ours:
            ex = tvm.compile(mod, target=target, relax_pipeline=strategy_pipeline(s, target))
            calls: list[str] = []
            out = run(ex, inputs, calls=calls)
            row["kernels"][s] = len(calls)
            row["err"][f"{s}@{t}"] = _scale_error(out[0], ref)
            samplers[f"{s}@{t}"] = _with_threads(vm_sampler(ex, inputs, min_ms=_SAMPLE_MS), t)
        samplers[f"torch@{t}"] = _torch_sampler(module, args, t)
        if with_ort and "ort" not in row["failed"]:
            try:  # an export the ONNX exporter refuses costs the ORT column, not the row
                sess = _ort_session(module, args, list(inputs), t, onnx_path)
            except Exception as err:  # noqa: BLE001 -- reported in the row and the table
                row["failed"]["ort"] = f"{type(err).__name__}: {str(err).splitlines()[0]}"[:160]
            else:
                feed = {i.name: a
                        for i, a in zip(sess.get_inputs(), inputs.values(), strict=True)}
                row["err"][f"ort@{t}"] = _scale_error(sess.run(None, feed)[0], ref)
                samplers[f"ort@{t}"] = call_sampler(
                    lambda sess=sess, feed=feed: sess.run(None, feed), _SAMPLE_MS)
        with OtherLoad() as load:
            timed = interleave(samplers, repeat)
        row["other_load"][str(t)] = load.cores
        for k, v in timed.items():
            row["ms"][k] = float(np.median(v)) * 1e3
    return row


def _load_cell(row: dict) -> str:
    """Other processes' cores during each thread count's rounds (``measurement.quiet``)."""
    loads = row.get("other_load", {})
    return " / ".join(f"{loads[t]:.2f}" for t in sorted(loads, key=int)) or "n/a"


def _table(rows: list[dict], threads: list[int], with_ort: bool,
           ours: tuple[str, ...] = OURS) -> str:
    peers = ["torch"] + (["ort"] if with_ort else [])
    cols = [f"{c}@{t}" for t in threads for c in (*ours, *peers)]
    head = ["model", "family", *(f"k {s}" for s in ours), *(f"{c} ms" for c in cols), "max err",
            "other load"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r.get('family', '')} | failed: {r['error']} |")
            continue
        cells = [r["model"], r["family"], *(str(r["kernels"].get(s, "-")) for s in ours),
                 *(f"{r['ms'].get(c, math.nan):.2f}" for c in cols),
                 f"{max(r['err'].values()):.1e}", _load_cell(r)]
        lines.append("| " + " | ".join(cells) + " |")
    ok = [r for r in rows if "error" not in r]
    lines.append("")
    disturbed = [r["model"] for r in ok if max(r.get("other_load", {}).values(),
                                               default=math.nan) > DISTURBED_CORES]
    if disturbed:
        lines.append(f"- disturbed (other processes used > {DISTURBED_CORES} cores while a row "
                     f"was timed; rerun them on a quiet machine): {', '.join(disturbed)}")
    for r in ok:
        for column, why in r.get("failed", {}).items():
            lines.append(f"- {r['model']}: no {column} column: {why}")
    for t in threads:
        for num in (*(s for s in ours if s.startswith("costfuse")),
                    *(("tvm",) if "tvm" in ours else ())):
            variant = ("costfuse",) if num.startswith("costfuse-") and "costfuse" in ours else ()
            for den in ("none", "tvm", *variant, *peers):
                if num == den or (num == "tvm" and den != "none"):
                    continue
                ratios = [r["ms"][f"{den}@{t}"] / r["ms"][f"{num}@{t}"] for r in ok
                          if f"{den}@{t}" in r["ms"] and f"{num}@{t}" in r["ms"]]
                if ratios:
                    lines.append(f"- {t} thread(s): {num} speedup over {den}: geomean "
                                 f"{geomean(ratios):.2f}x, min {min(ratios):.2f}x "
                                 f"({len(ratios)} models)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=None, help="corpus names (default: all)")
    ap.add_argument("--small", action="store_true", help="the corpus' small variants")
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--repeat", type=int, default=5, help="interleaved rounds")
    ap.add_argument("--no-ort", action="store_true", help="skip the ONNX Runtime columns")
    ap.add_argument("--ours", nargs="+", default=list(OURS),
                    help=f"our strategies to time (default {' '.join(OURS)}; e.g. add "
                         "costfuse-xgb)")
    ap.add_argument("--out", default=None, help="also write the markdown table here")
    ap.add_argument("--rows", default=None,
                    help="append each model's row to this JSON-lines file as it finishes (a long "
                         "run keeps what it measured) and skip models already in it")
    args = ap.parse_args()
    if args.repeat < 1 or any(t < 1 for t in args.threads):
        ap.error("--repeat and --threads must be positive")
    names = args.models or corpus.names()
    unknown = sorted(set(names) - set(corpus.names()))
    if unknown:
        ap.error(f"unknown corpus models: {', '.join(unknown)}")
    rows = []
    if args.rows and os.path.exists(args.rows):
        with open(args.rows) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    done = {r["model"] for r in rows}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            if name in done:
                continue
            start = time.perf_counter()
            try:
                row = bench_model(name, args.small, args.threads, args.repeat,
                                  not args.no_ort, tmp, tuple(args.ours))
            except Exception as err:  # noqa: BLE001 -- a model that fails is a row saying so
                row = {"model": name, "error": f"{type(err).__name__}: {err}"[:200]}
            rows.append(row)
            if args.rows:
                with open(args.rows, "a") as f:
                    f.write(json.dumps(row) + "\n")
            print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)
    rows = [r for r in rows if r["model"] in names]
    table = _table(rows, args.threads, not args.no_ort, tuple(args.ours))
    print(f"host {host_target()}, {os.cpu_count()} CPUs, small={args.small}, "
          f"repeat={args.repeat}")
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
