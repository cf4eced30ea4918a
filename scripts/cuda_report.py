"""Per-kernel registers and spills of zoo models compiled for CUDA (FuseOps + dlight, no GPU).

python scripts/cuda_report.py mlp_gelu bert_layer --arch sm_90 [--small]
"""

from __future__ import annotations

import argparse
import time

from tvm_costfuse import models
from tvm_costfuse.measurement.registers import cuda_register_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=models.zoo.names(), help="zoo names (default all)")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--small", action="store_true", help="the small variants")
    args = parser.parse_args()
    for name in args.models:
        start = time.perf_counter()
        rows = cuda_register_report(name, arch=args.arch, small=args.small)
        took = time.perf_counter() - start
        print(f"== {name} ({len(rows)} kernels, {took:.1f} s)")
        print(
            f"{'kernel':60s} {'threads':>7s} {'regs':>5s} {'spill st':>8s} {'spill ld':>8s}"
            f" {'stack':>6s} {'smem':>6s}"
        )
        for row in rows:
            r = row.resources
            print(
                f"{row.kernel[:60]:60s} {row.threads or '-':>7} {r.registers:5d}"
                f" {r.spill_store_bytes:8d} {r.spill_load_bytes:8d} {r.stack_frame_bytes:6d}"
                f" {r.shared_memory_bytes:6d}"
            )


if __name__ == "__main__":
    main()
