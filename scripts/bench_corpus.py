"""Corpus benchmark: ``costfuse bench`` (``report/bench.py``) over the corpus, resumable.

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
import os
import tempfile
import time

from tvm_costfuse import host_target
from tvm_costfuse.models import corpus
from tvm_costfuse.report.bench import DEFAULT_PEERS, OURS, bench, table, workload


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
    peers = tuple(p for p in DEFAULT_PEERS if not (args.no_ort and p == "ort"))
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
                row = bench(workload(name, args.small), args.threads, args.repeat, tmp,
                            tuple(args.ours), peers)
            except Exception as err:  # noqa: BLE001 -- a model that fails is a row saying so
                row = {"model": name, "error": f"{type(err).__name__}: {err}"[:200]}
            rows.append(row)
            if args.rows:
                with open(args.rows, "a") as f:
                    f.write(json.dumps(row) + "\n")
            print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)
    rows = [r for r in rows if r["model"] in names]
    text = table(rows, args.threads, tuple(args.ours), peers)
    print(f"host {host_target()}, {os.cpu_count()} CPUs, small={args.small}, "
          f"repeat={args.repeat}")
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
