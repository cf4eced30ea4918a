"""Measure the candidate groups the planner weighs, one kernel each, into a GroupDatabase.

For a model and a target, every merge decision of ``planner.plan_greedy`` names two groups
(``left``, ``right``); the candidates are both parts and their union. Each candidate is built
exactly as the fused model would build it -- ``apply_partition`` with that one group, ``FuseTIR``
(or the op's own PrimFunc for a one-op group) -- scheduled with our CPU rules, compiled alone and
called from Relax VM functions (what the kernel pays inside a model: dispatch, output
allocation, thread-pool wake-up; short kernels as a chain of calls) and timed with
``time_evaluator`` on random inputs (one warm-up call, then ``repeat`` samples of at least
``min_repeat_ms`` each).

On a CUDA target the candidates are scheduled with dlight's GPU rules (as ``tvm.compile``
would), compiled to CUDA C and run through ``nvcc --resource-usage``: ptxas registers and spill
bytes are stored with every record, GPU or not; the kernel is timed the same way on a GPU when
one is present, and otherwise recorded untimed (``run_secs`` empty, ``not_timed`` says why), which
the learned model does not train on.

Every row is stamped with ``versions.kernel_version()`` (a digest of the code that forms,
schedules and times the kernel): a group or workload recorded under another stamp is measured
again, since its time is of another kernel, unless ``restamp`` finds its kernel and harness
unchanged (each row records both: ``kernel_hash``, ``harness``).

Build and run happen in a worker process (TVM's ``PopenPoolExecutor``) under a timeout, as
meta-schedule's LocalBuilder/LocalRunner do: a crash, an exception or a timeout fails that
candidate and the session goes on. A failure of the kernel's build or run is a record
(``run_secs = [1e10]`` plus the full error text); any other (a timeout, a lost worker, RPC) is
logged in the features log as the environment's and measured again next session. Arguments
that would fail every candidate alike (an RPC tracker that does not answer) are refused first.

A candidate whose kernel has symbolic shapes (a dynamic batch) is not measured, and a warning
says how many were left out: the planner never prices such a group (``transform`` leaves it to
FuseOps), meta-schedule's database records static shapes only, and a random input for a
symbolic shape has no size to time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from ..config import FusionConfig
from ..cost.extract import group_features
from ..cost.features import FEATURE_NAMES
from ..graph import OpGraph, build_graph
from ..partition import apply_partition
from ..pipelines import prepare
from ..planner import plan_greedy
from ..records.database import (
    FAILED_RUN_SECS,
    GroupDatabase,
    default_work_dir,
    failure_kind,
    headline,
    symbolic_dims,
    workload_hash,
)
from ..schedules import backend, first_rule
from ..schedules.prepack import mark_constant_weights
from ..targets import resolve
from .recorded import RecordedModels
from .runners import (
    MeasureConfig,
    _Runner,
    build_and_profile_cuda,
    check_rpc_tracker,
    runner_kind,
)
from .versions import harness_version, kernel_hash, kernel_version

__all__ = ["MeasureConfig", "MeasureSummary", "build_and_profile_cuda", "candidate_groups",
           "group_kernel", "measure_model"]

_log = logging.getLogger(__name__)


@dataclass
class MeasureSummary:
    """What one ``measure_model`` call did."""

    model: str
    measured: int = 0
    failed: int = 0
    reused: int = 0  # workload already recorded (same kernel seen before): not re-measured
    skipped: int = 0  # (model, group) already recorded
    stale: int = 0  # (model, group) recorded for other kernels (``versions``): taken up again
    unformable: int = 0  # the planner weighed it but apply_partition rejects it (not convex)
    untimed: int = 0  # CUDA without a GPU: compiled and ptxas-profiled, not timed
    views: int = 0  # a lone reshape: TVM runs it as a view, there is no kernel to time
    symbolic: int = 0  # a kernel with symbolic shapes: never priced, not recordable, not timed
    # failed for a reason outside the kernel (timeout, lost worker, RPC): measured again next
    # session (also counted in ``failed``)
    environment: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)  # one line each; the rows hold the text
    repairs: list[str] = field(default_factory=list)  # what opening the database repaired


def candidate_groups(graph: OpGraph, target_desc, config: FusionConfig | None = None
                     ) -> list[tuple[str, ...]]:
    """Left part, right part and union of every merge the greedy planner weighs, deduplicated,
    in the order first seen; members sorted by binding order."""
    plan = plan_greedy(graph, target_desc, config or FusionConfig())
    seen: dict[frozenset, tuple[str, ...]] = {}
    for d in plan.decisions:
        for g in (d.left, d.right, d.left + d.right):
            key = frozenset(g)
            if key not in seen:
                seen[key] = tuple(sorted(g, key=lambda n: graph[n].index))
    return list(seen.values())


def group_kernel(prepared: tvm.IRModule, graph: OpGraph, members: Iterable[str]
                 ) -> tvm.tirx.PrimFunc:
    """The one PrimFunc that computes ``members``: FuseTIR's output for a group of two or more
    call_tir bindings, the op's own PrimFunc for one."""
    return group_kernel_and_outputs(prepared, graph, members)[0]


def group_kernel_and_outputs(prepared: tvm.IRModule, graph: OpGraph, members: Iterable[str],
                             marked: tvm.IRModule | None = None
                             ) -> tuple[tvm.tirx.PrimFunc, int]:
    """:func:`group_kernel` and how many of its trailing parameters are outputs
    (destination-passing style: inputs first, then outputs). ``marked``: ``prepared`` after
    ``mark_constant_weights``, when the caller asks for many groups of one model (marking
    copies the whole module)."""
    members = list(members)
    calls = [n for n in members if graph[n].kind == "call_tir"]
    if len(calls) == 1:
        node = graph[calls[0]]
        # Marked as in a model build, so the CPU rules pack its constant weights alike.
        marked = marked if marked is not None else mark_constant_weights(prepared)
        return marked[node.prim_func], len(node.outputs)
    grouped = apply_partition(prepared, [members], graph.func_name)
    names = [gv.name_hint for gv, f in grouped.functions.items()
             if isinstance(f, relax.Function) and "Primitive" in (f.attrs or {})]
    if len(names) != 1:
        raise ValueError(f"group {members} made {len(names)} grouped functions, not 1")
    ret = grouped[names[0]].ret_ty
    n_out = len(ret.fields) if isinstance(ret, relax.TupleType) else 1
    return mark_constant_weights(relax.transform.FuseTIR()(grouped))[names[0]], n_out


def schedule_kernel(func: tvm.tirx.PrimFunc, target: tvm.target.Target):
    """(scheduled PrimFunc, trace) from the target's rules (``schedules.first_rule``: ours on
    a CPU, dlight's on CUDA), or (func, empty trace) when none applies. The kernel, scheduled
    or not, then goes through the backend's finishing passes as in a model's build, so what
    is timed is the kernel the model runs; the trace is the rules' alone (a database record
    replays it, and the build finishes it the same way)."""
    finish = backend(target).finish
    sch = first_rule(func, target)[1]
    if sch is not None:
        return finish(sch.mod["main"]), sch.trace
    return finish(func), tvm.s_tir.Schedule(func).trace


def feature_row(model: str, graph: OpGraph, members, features=None) -> dict:
    """The features part of a group's database row: the learned vector and its context
    (``features``: the group's, when the caller has computed them)."""
    f = features if features is not None else group_features(graph, members)
    return {"model": model, "members": list(members), "features": f.vector(),
            "feature_names": list(FEATURE_NAMES), "context": f.context()}


def measure_model(
    model: str,
    mod: tvm.IRModule,
    target,
    work_dir=None,
    config: MeasureConfig | None = None,
    *,
    groups: Iterable[Iterable[str]] | None = None,
    max_groups: int | None = None,
    fusion_config: FusionConfig | None = None,
    prepared: bool = False,
    runner_fn: Callable | None = None,
    log: Callable[[str], None] | None = None,
    wait: bool = False,
) -> MeasureSummary:
    """Measure the candidate groups of one model into ``work_dir`` (resumable).

    Parameters
    ----------
    model : str
        Name recorded with each group (the leave-one-model-out key).
    mod : IRModule
        The model (zoo form), or the module after ``pipelines.prepare`` with ``prepared=True``.
    target
        Anything :func:`tvm_costfuse.targets.resolve` takes: an LLVM target with ``mcpu`` and
        ``num-cores`` (``targets.host_target()``), a GPU preset name, a resolved ``Target``
        (its description prices the candidates: a bare sm_90 target is priced as an H100).
    work_dir : str or Path, optional
        GroupDatabase folder; default ``database.default_work_dir(target)``.
    groups : iterable of groups, optional
        Groups to measure instead of :func:`candidate_groups` (binding names).
    max_groups : int, optional
        Stop after this many candidates (budget cap).
    runner_fn : callable, optional
        Replaces the target kind's runner, local or RPC (``runners.runner_kind``; tests inject
        failures with it; needs isolate=False unless importable by the worker).
    wait : bool
        Another session writing ``work_dir``: wait for it (else ``DatabaseLocked``).

    Returns
    -------
    MeasureSummary
        Counts of measured, failed, reused (workload already in the database), skipped and
        unformable groups (a merge the planner rejected as not convex has no kernel), and of
        lone reshapes left unmeasured (a model runs them as views).
        Groups whose kernel has symbolic shapes are counted in ``symbolic``, not measured,
        and one warning names how many. Nothing raised by building or running a kernel
        escapes. Raises ``ValueError`` before
        measuring when the RPC tracker cannot serve, ``DatabaseLocked`` when another session
        writes ``work_dir`` and ``wait`` is false.
    """
    resolved = resolve(target)
    target, target_desc = resolved.tvm, resolved.desc
    config = config or MeasureConfig()
    log = log or (lambda _msg: None)
    timing = runner_kind(target)
    if config.rpc_tracker is not None:
        if timing.rpc is None:
            raise ValueError(f"the RPC runner times CPU kernels only; measure "
                             f"{target.kind.name} kernels on their device's host")
        check_rpc_tracker(config.rpc_tracker)
    db = GroupDatabase(work_dir or default_work_dir(target))
    start = time.perf_counter()
    prep = mod if prepared else prepare(mod, target)
    graph = build_graph(prep)
    marked = mark_constant_weights(prep)
    cands = ([tuple(sorted(g, key=lambda n: graph[n].index)) for g in groups]
             if groups is not None else candidate_groups(graph, target_desc, fusion_config))
    if max_groups is not None:
        cands = cands[:max_groups]
    summary = MeasureSummary(model)
    # On a GPU, groups recorded untimed (compiled where there was none) are measured now.
    gpu = timing.times_untimed()
    default_fn = timing.local if config.rpc_tracker is None else timing.rpc
    with db.writing(wait=wait, log=log):
        summary.repairs = list(db.repairs)
        _measure_all(db, model, graph, prep, marked, cands, target, config,
                     _Runner(config, runner_fn or default_fn), gpu, summary, log)
    summary.seconds = time.perf_counter() - start
    if summary.symbolic:
        _log.warning("%s: %d candidate group(s) with symbolic shapes not measured (the planner "
                     "leaves them to FuseOps; meta-schedule records static shapes only)",
                     model, summary.symbolic)
    return summary


def _measure_all(db, model, graph, prep, marked, cands, target, config, runner, gpu,
                 summary: MeasureSummary, log) -> None:
    """The measuring loop of :func:`measure_model` (holding the database's lock)."""
    kernels = kernel_version()
    try:
        for members in cands:
            if db.has_group(model, members) and not (gpu and db.is_untimed(model, members)):
                if db.has_group(model, members, kernels):
                    summary.skipped += 1
                    continue
                summary.stale += 1  # recorded for other kernels: taken up as a new group
            features = group_features(graph, members)
            if features.is_view:
                summary.views += 1  # timing it as a copy kernel would be a wrong label
                log(f"  {model} {'+'.join(members)}: a view in the model, not a kernel")
                continue
            row = {**feature_row(model, graph, members, features), "kernels": kernels}
            try:
                func, n_out = group_kernel_and_outputs(prep, graph, members, marked)
            except Exception as err:  # noqa: BLE001 -- a group that cannot form one kernel
                summary.unformable += 1
                summary.errors.append(f"{members}: fuse: {err}")
                log(f"  {model} {'+'.join(members)}: could not form the kernel: {err}")
                continue
            dims = symbolic_dims(func)
            if dims:
                summary.symbolic += 1
                log(f"  {model} {'+'.join(members)}: symbolic shapes ({', '.join(dims)}): "
                    "not measured")
                continue
            whash = workload_hash(func)
            old = (db.row_for_hash(whash, timed=gpu, kernels=kernels)
                   if db.has_workload(whash) else None)
            if old is not None:
                extra = {k: old[k] for k in ("ptxas", "not_timed", "failure", "kernel_hash",
                                             "harness") if k in old}
                db.append_row({**row, **extra, "workload_hash": whash, "measured": False,
                               "run_secs": old.get("run_secs", [FAILED_RUN_SECS]),
                               "error": old.get("error"), "target": str(target)})
                summary.reused += 1
                continue
            scheduled, trace = schedule_kernel(func, target)
            try:  # a kernel that does not lower is the worker's failure to record, not ours
                row.update(kernel_hash=kernel_hash(scheduled, target, n_out),
                           harness=harness_version())
            except Exception as err:  # noqa: BLE001 -- no hash: restamp cannot vouch for it
                _log.debug("%s %s: not hashed: %s", model, "+".join(members), err)
            run_secs, error, extra = runner(scheduled, target, n_out)
            kind = failure_kind(error)
            if kind == "environment":
                # Not the kernel's outcome: kept out of TVM's database, measured next time.
                db.append_row({**row, **extra, "error": error, "failure": kind,
                               "run_secs": [], "measured": False, "workload_hash": whash,
                               "target": str(target)})
                summary.failed += 1
                summary.environment += 1
                summary.errors.append(f"{members}: {headline(error)} (environment: retried "
                                      "next session)")
                log(f"  {model} {'+'.join(members)}: {headline(error)} (retried next session)")
                continue
            db.commit(func, trace, run_secs, target,
                      {**row, "error": error, **({"failure": kind} if kind else {}), **extra})
            if error:
                summary.failed += 1
                summary.errors.append(f"{members}: {headline(error)}")
            elif extra.get("not_timed"):
                summary.untimed += 1
            else:
                summary.measured += 1
            shown = headline(error) if error else (f"{float(np.median(run_secs)) * 1e6:.1f} us"
                              if run_secs else f"not timed ({extra.get('not_timed')})")
            if extra.get("ptxas"):
                shown += " | {registers} registers, {spill_bytes} B spilled".format(
                    **extra["ptxas"])
            log(f"  {model} {'+'.join(members)}: {shown}")
    finally:
        runner.close()


def refeature(work_dir=None, target=None) -> tuple[int, int, dict[str, str]]:
    """Recompute the features of every recorded group from its model, keeping the timings.

    What to run when the feature schema grew (``GroupFeatures.from_row`` warns about rows
    without the new fields): the models are rebuilt by name (``models.load_variant``), as the
    planner sees them (weights folded) or, for rows recorded before folding (members such as
    ``batch_norm`` that folding removes), unfolded. A model that no longer loads (a file
    moved) or whose graphs both fail to build, or a row whose members neither built graph has,
    keeps its rows as they were; a graph that fails blocks only the rows that need it. Returns
    (rows recomputed, models, {model or row that was kept: why}).
    """
    resolved = resolve(target or "host")
    db = GroupDatabase(work_dir or default_work_dir(resolved.tvm))
    recorded = RecordedModels(resolved.tvm)
    missing: dict[str, str] = {}
    rows, recomputed = [], 0
    for row in db.rows():
        model, members = row["model"], row["members"]
        found = recorded.for_row(model, members)
        if found is None:
            key, why = recorded.why_not(model, members)
            missing[key] = why
            rows.append(row)
            continue
        rows.append({**row, **feature_row(model, found.graph, members)})
        recomputed += 1
    with db.writing(salvage=False):
        db.rewrite_rows(rows)
    return recomputed, recorded.models_built(), missing
