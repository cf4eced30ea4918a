"""Which kernels a measured row timed: a digest of the code that forms, schedules and times them.

A row of ``features.jsonl`` is a label only for the kernel it timed. When the schedule rules,
the passes that finish a kernel, the way a group becomes one kernel or the way it is timed
change, the same group (and the same workload hash: the hash is of the *unscheduled* PrimFunc)
runs another kernel, and its old time is a wrong label. The feedback loop stamps every row it
writes with :func:`kernel_version` and reuses a row, by group or by workload, only when the
stamp matches; a row without one (measured before stamps existed) is measured again.

Why a digest of the source and not a number kept by hand: a number is bumped only when someone
remembers that a change alters the kernels (the labels timed unfinished kernels for days that
way, docs/log/2026-12-02.md). A digest re-measures after every edit of these files, comments
included: a wasted measurement is cheaper than a wrong label.

A digest cannot tell which rows an edit left alone, and re-measuring everything takes a whole
tune run. So each row also records what it timed: :func:`kernel_hash`, the structural hash of
its kernel lowered by the TIR pipeline the runner builds with, and :func:`harness_version`,
the digest of the code around the kernel that times it (:data:`HARNESS_SOURCES`). ``restamp.py`` rebuilds a stale row's kernel: where both are unchanged, the row's
time is a label of the current kernel and it takes the current stamp; every other row is
measured again.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import tvm

from .. import schedules

__all__ = ["HARNESS_SOURCES", "KERNEL_SOURCES", "digest", "harness_version", "kernel_hash",
           "kernel_version"]

_PACKAGE = Path(__file__).resolve().parent.parent
_SCHEDULES = Path(schedules.__file__).resolve().parent  # schedules/ at the top of the repo
# What decides the kernel a row timed, beside the installed TVM: the schedule rules and the
# passes after them, how a group becomes one PrimFunc (feedback, partition, fusor; the
# pre-fusion passes of pipelines, the weight folding among them), how it is built and timed (runners with pipelines'
# build pipeline and strategies' choice of TIR pipeline, measurement/timing).
# The cards' own module, the catalog and the contraction efficiency model only price kernels
# (a card's numbers beside its rule are in the rule's file, and count).
_PRICING_ONLY = ("card.py", "catalog.py", "efficiency.py")
KERNEL_SOURCES = (
    *sorted(p for p in _SCHEDULES.glob("*.py") if p.name not in _PRICING_ONLY),
    _PACKAGE / "tuning" / "feedback.py",
    _PACKAGE / "tuning" / "runners.py",
    _PACKAGE / "partition.py",
    _PACKAGE / "fusor.py",
    _PACKAGE / "pipelines.py",
    _PACKAGE / "strategies.py",  # which TIR pipeline lowers the runner's builds
    *sorted((_PACKAGE / "fold").glob("*.py")),  # the weight folding ahead of the pipelines
    _PACKAGE / "measurement" / "timing.py",
)
# What a row's time means beyond its lowered kernel, beside the installed TVM (its LLVM codegen
# and the finalizing passes after our TIR pipeline): the runner's harness (a VM calling the
# kernel, samples, thread pool), the timing helpers, the relax build pipeline and the backend
# record choosing its passes, the CUDA source and register readers (ptxas labels), and the
# hash below itself (hashes of another procedure do not compare). The CUDA toolkit's version is
# not in it: a row's ptxas figures are kept across an nvcc upgrade.
HARNESS_SOURCES = (
    _PACKAGE / "tuning" / "runners.py",
    _PACKAGE / "tuning" / "versions.py",
    _PACKAGE / "measurement" / "timing.py",
    _PACKAGE / "measurement" / "cuda_source.py",
    _PACKAGE / "measurement" / "registers.py",
    _PACKAGE / "pipelines.py",
    _SCHEDULES / "backends.py",
)


def digest(paths, tvm_version: str = tvm.__version__) -> str:
    """12 hex digits of sha256 over the TVM version and each file's name and bytes."""
    h = hashlib.sha256(tvm_version.encode())
    for path in paths:
        h.update(Path(path).name.encode())
        h.update(Path(path).read_bytes())
    return h.hexdigest()[:12]


@functools.cache
def kernel_version() -> str:
    """The digest of :data:`KERNEL_SOURCES` with the installed TVM's version."""
    return digest(KERNEL_SOURCES)


@functools.cache
def harness_version() -> str:
    """The digest of :data:`HARNESS_SOURCES` with the installed TVM's version."""
    return digest(HARNESS_SOURCES)


def kernel_hash(scheduled: tvm.tirx.PrimFunc, target: tvm.target.Target, n_out: int) -> str:
    """16 hex digits: the structural hash of ``scheduled`` (a group's kernel after the rules and
    the backend's finishing passes, as the runner receives it) lowered by the main stage of
    the TIR pipeline the runner builds with, and of ``n_out`` (its trailing output parameters,
    which the VM allocates). Two kernels with one hash compile alike.

    Names do not count: the messages of the argument checks ``MakePackedAPI`` writes quote
    parameter names, which are the group's bindings' (``matmul6`` in one model, ``matmul`` in
    another, one workload), so they are emptied first. Lowered under a default PassContext, as
    the runner's worker builds."""
    import tvm_ffi

    from ..strategies import tir_pipeline

    host = target.host or (target if target.kind.name == "llvm" else tvm.target.Target("llvm"))
    mod = tvm.IRModule({"kernel": scheduled.with_attr("global_symbol", "kernel")})
    mod = tvm.tirx.transform.BindTarget(target.with_host(host))(mod)
    with tvm.transform.PassContext(), target:
        lowered = tvm.tirx.get_tir_pipeline(tir_pipeline())[0](mod)
    lowered = tvm_ffi.structural_map(lowered, (tvm.tirx.AssertStmt, _without_message))
    h = tvm_ffi.structural_hash(lowered, map_free_vars=True)
    return hashlib.sha256(f"{h:016x}:{n_out}".encode()).hexdigest()[:16]


def _without_message(stmt: tvm.tirx.AssertStmt) -> tvm.tirx.AssertStmt:
    # TVM's constructor, called directly: the Python class passes kind and condition to it in
    # the wrong order (0.27)
    return tvm.tirx._ffi_api.AssertStmt(stmt.condition, stmt.error_kind, [], stmt.span)
