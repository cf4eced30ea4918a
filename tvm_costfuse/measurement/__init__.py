"""Measurement: ground truth that the cost models are judged and trained against.

- ``timing``      -- build and run on the Relax VM, numerics, interleaved timings;
- ``peers``       -- PyTorch eager, ``torch.compile`` and ONNX Runtime timed at equal threads;
- ``registers``   -- ptxas registers and spills per CUDA kernel, x86 spill counts via llvmlite;
- ``cuda_source`` -- compile for CUDA without a GPU, CUDA C per kernel;
- ``calibrate``   -- this host's bandwidth, FLOP/s and kernel launch cost;
- ``quiet``       -- how busy the rest of the machine was while a benchmark timed.
"""
