"""Shared fixtures: prepared zoo models and their unfused reference outputs, built once."""

from __future__ import annotations

import functools
import logging
import os

# Plans must not depend on a host calibration someone left in ~/.cache, nor measure one on
# first use: the documented defaults price every plan in the suite.
os.environ["TVM_COSTFUSE_CALIBRATION"] = "none"

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from tvm_costfuse import models
from tvm_costfuse.measurement.timing import build, run
from tvm_costfuse.pipelines import prepare

# CI draws the same plans every run (a red CI must be reproducible); set
# HYPOTHESIS_PROFILE=explore locally to draw new ones.
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("explore", parent=settings.get_profile("ci"), derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _schedule_rules_raise_nothing_unexpected(caplog):
    """A CPU rule that raises anything but a schedule primitive's refusal is a bug in the rule
    (the kernel falls to the next rule and still runs, so only this log shows it)."""
    yield
    bugs = [r.getMessage() for r in caplog.records
            if r.name == "tvm_costfuse.schedules._loops" and r.levelno >= logging.WARNING]
    assert not bugs, "schedule rules raised: " + "; ".join(bugs[:3])


@functools.cache
def prepared(name: str, small: bool = True, fold: bool = True):
    """(module after the pre-fusion passes, example inputs) for a zoo model; ``fold=False``
    keeps its batch norms as the model wrote them."""
    mod, inputs = models.load(name, small=small)
    return prepare(mod, fold=fold), inputs


@functools.cache
def reference(name: str) -> list[np.ndarray]:
    """Outputs of the small model built with no fusion and no weight folding at all."""
    mod, inputs = prepared(name, fold=False)
    return run(build(mod, fusion=None), inputs)


class QuietLoad:
    """``measurement.quiet.OtherLoad`` reading no other load, whatever else the host runs (a
    first-use calibration measured while others kept the machine busy is not cached)."""

    cores = 0.0

    def __enter__(self):
        return self

    def __exit__(self, *_exc) -> None:
        return None


def kernels(mod) -> list[str]:
    """The bindings of ``mod`` that call a kernel (call_tir), in program order."""
    from tvm_costfuse import build_graph

    return [n.name for n in build_graph(mod).nodes if n.kind == "call_tir"]


def fused_kernel(mod, group: list[str]):
    """The one PrimFunc FuseTIR makes of ``group`` (the rest of ``mod`` left unfused)."""
    from tvm import relax, tirx

    from tvm_costfuse.partition import ApplyPartition

    fused = relax.transform.FuseTIR()(ApplyPartition([group])(mod))
    (func,) = [f for gv, f in fused.functions.items()
               if isinstance(f, tirx.PrimFunc) and gv.name_hint.startswith("fused")]
    return func


def compacted(func) -> dict[str, tuple[str, list[int]]]:
    """Name -> (scope, shape) of the buffers a scheduled function allocates, each cut to the
    region one iteration of its loop nest uses (as lowering allocates them)."""
    import tvm
    import tvm_ffi
    from tvm import s_tir

    lower = s_tir.transform
    mod = tvm.transform.Sequential([
        lower.LowerInitBlock(), lower.PlanAndUpdateBufferAllocationLocation(),
        lower.ConvertBlocksToOpaque(), lower.CompactBufferAllocation()])(
            tvm.IRModule({"main": func}))
    found = {}
    tvm_ffi.structural_walk(mod["main"].body, (s_tir.SBlock, lambda b: found.update(
        {buf.name: (buf.scope(), [int(x) for x in buf.shape]) for buf in b.alloc_buffers})))
    return found
