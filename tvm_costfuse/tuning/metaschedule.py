"""Meta-schedule tuning for fused kernels, with our CPU rules as the fallback.

Two steps, run in this order:

1. :func:`tune_model` fuses a model exactly as the build will (``prepare``, the fusion pass,
   ``FuseTIR``), extracts one meta-schedule task per distinct fused PrimFunc and tunes them into
   a ``JSONDatabase`` under ``work_dir`` (default ``tuning_logs/<kind>-<mcpu>/``).
2. :func:`tuned_pipeline` is the usual pipeline with ``MetaScheduleApplyDatabase`` right after
   ``FuseTIR`` and before our rule-based schedule pass. ApplyDatabase replaces only the PrimFuncs
   that have a record and marks them ``tirx.is_scheduled``; dlight's ``ApplyDefaultSchedule``
   (which runs our rules) skips PrimFuncs with that attribute, so untuned kernels still get the
   rules and tuned ones keep their tuned schedule.

Tuning builds and runs candidates in worker processes: on a 2-core machine each builder worker
spends ~17 s importing TVM's tensor intrinsics before its first build, so TVM's default 30 s
builder timeout kills every candidate; we use 180 s.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import tvm
from tvm import relax
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from .. import pipelines
from ..pipelines import build_pipeline
from ..records.database import target_dir
from ..schedules import schedule_pass
from ..strategies import fusion_pass

__all__ = ["fuse", "target_dir", "tune_model", "tuned_pipeline"]

# Builder workers import tvm.s_tir.tensor_intrin (~17 s on 2 busy cores) before their first build.
BUILDER_TIMEOUT_S = 180.0
# Runner workers import TVM too; one run of a small kernel is milliseconds.
RUNNER_TIMEOUT_S = 120.0


@derived_object
class _LocalBuilder(ms.builder.LocalBuilder._cls):
    """``LocalBuilder`` without its start-up sanity check.

    The check starts a throw-away worker (~20 s on 2 cores) only to confirm that the build and
    export functions resolve there; we always use TVM's defaults, which do.
    """

    def _sanity_check(self) -> None:
        if self.f_build is not None or self.f_export is not None:
            super()._sanity_check()


@derived_object
class _InProcessBuilder(ms.builder.PyBuilder):
    """LocalBuilder's work in this process: no worker to start (each LocalBuilder batch
    starts a fresh one, which imports TVM's tensor intrinsics first: ~50 s on 2 busy cores).
    For smoke runs; a build that crashes takes this process with it."""

    def build(self, build_inputs):
        from tvm.s_tir.meta_schedule.builder.local_builder import _worker_func

        results = []
        for bi in build_inputs:
            try:
                path = _worker_func(None, None, bi.mod, bi.target, bi.params)
                results.append(ms.builder.BuilderResult(path, None))
            except Exception as err:  # noqa: BLE001 -- recorded as the candidate's failure
                results.append(ms.builder.BuilderResult(None, f"in-process build: {err}"))
        return results


@derived_object
class _InProcessRunner(ms.runner.PyRunner):
    """LocalRunner's work (TVM's own worker function) in this process, for smoke runs: no
    timeout (a kernel that hangs hangs the caller)."""

    def __init__(self) -> None:
        super().__init__()
        self.config = ms.runner.EvaluatorConfig._normalized(None)

    def run(self, runner_inputs):
        from tvm.s_tir.meta_schedule.runner.local_runner import LocalRunnerFuture, _worker_func

        futures = []
        for ri in runner_inputs:
            try:
                costs = _worker_func(None, None, None, self.config, 1, str(ri.artifact_path),
                                     str(ri.device_type),
                                     tuple(a.as_json() for a in ri.args_info))
                futures.append(LocalRunnerFuture(res=costs, error_message=None))
            except Exception as err:  # noqa: BLE001 -- recorded as the candidate's failure
                futures.append(LocalRunnerFuture(res=None, error_message=str(err)))
        return futures


def _import_tensor_intrinsics() -> None:
    """Import TVM's tensor intrinsics (meta-schedule's TuneContext imports them on first use)
    from a fresh thread. Their TVMScript parser calls ``inspect.stack()`` some 500 times, and
    each call's cost grows with the caller's stack depth: measured 38 s from a fresh thread
    against 222 s at a depth of 60 frames (a test runner's) on a 2-core host."""
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    failure: list[BaseException] = []

    def load() -> None:
        try:
            importlib.import_module("tvm.s_tir.tensor_intrin")
        except BaseException as err:  # noqa: BLE001 -- raised again in the caller's thread
            failure.append(err)

    thread = threading.Thread(target=load, name="costfuse-tensor-intrin")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def fuse(mod: tvm.IRModule, target: tvm.target.Target | str, fusion: str = "tvm") -> tvm.IRModule:
    """The module the schedule pass sees: pre-fusion passes, ``fusion``, ``FuseTIR``.

    ``fusion`` is a strategy name of :mod:`tvm_costfuse.strategies` other than ``stock``.
    """
    target = tvm.target.Target(target)
    return pipelines.fuse(mod, target, fusion_pass(fusion, target))


def tune_model(
    mod: tvm.IRModule,
    target: tvm.target.Target | str,
    work_dir: str | Path | None = None,
    max_trials: int = 64,
    fusion: str = "tvm",
    *,
    max_trials_per_task: int | None = None,
    op_names: Sequence[str] | None = None,
    max_workers: int = 1,
    seed: int = 0,
    strategy: str = "evolutionary",
    in_process: bool = False,
) -> ms.Database:
    """Tune the fused kernels of ``mod`` for ``target`` into a JSON database in ``work_dir``.

    Parameters
    ----------
    mod : IRModule
        A model as the zoo gives it (high-level Relax, weights bound).
    target : Target or str
        Must carry ``num-cores`` (meta-schedule requires it for llvm); use
        ``targets.host_target()``.
    work_dir : str or Path, optional
        Where ``database_workload.json`` / ``database_tuning_record.json`` (and logs) go;
        defaults to :func:`~tvm_costfuse.records.database.target_dir`. Records accumulate
        across calls.
    max_trials : int
        Measured candidates over all tasks.
    fusion : str
        Fusion strategy whose kernels are tuned (must match the one given to
        :func:`tuned_pipeline`, or the workloads will not be found).
    max_trials_per_task : int, optional
        Cap per task; default ``max_trials``.
    op_names : sequence of str, optional
        Tune only tasks whose name contains one of these (e.g. ``["matmul"]``).
    max_workers : int
        Builder processes. One is fastest on 2 cores: each worker pays the TVM import.
    seed : int
        Search seed.
    strategy : str
        Meta-schedule's search strategy: ``evolutionary`` (its default, a cost-model-guided
        search over a population of thousands) or ``replay-trace`` (random samples of the
        design space, no search: seconds instead of minutes, for smoke runs).
    in_process : bool
        Build and time the candidates in this process instead of worker processes (no
        worker start-up; no timeout, and a crashing candidate takes the caller down): for
        smoke runs.

    Returns
    -------
    ms.Database
        The database holding the records (also on disk).
    """
    target = tvm.target.Target(target)
    work_dir = Path(work_dir) if work_dir is not None else target_dir(target)
    work_dir.mkdir(parents=True, exist_ok=True)
    fused = fuse(mod, target, fusion)
    names = [t.task_name for t in ms.relax_integration.extract_tasks(fused, target)]
    num_tasks = sum(1 for n in names if not op_names or any(op in n for op in op_names))
    if num_tasks == 0:
        raise ValueError(f"no task matches op_names={op_names}; tasks: {', '.join(names)}")
    _import_tensor_intrinsics()
    return ms.relax_integration.tune_relax(
        mod=fused,
        params={},
        target=target,
        work_dir=str(work_dir),
        max_trials_global=max_trials,
        max_trials_per_task=max_trials_per_task,
        op_names=list(op_names) if op_names else None,
        # The scheduler's first round visits every task once: a batch of a fair share each,
        # instead of the whole budget going to the first task.
        num_trials_per_iter=max(1, min(64, max_trials // num_tasks)),
        builder=(_InProcessBuilder() if in_process
                 else _LocalBuilder(max_workers=max_workers, timeout_sec=BUILDER_TIMEOUT_S)),
        runner=(_InProcessRunner() if in_process
                else ms.runner.LocalRunner(timeout_sec=RUNNER_TIMEOUT_S)),
        database=ms.database.JSONDatabase(work_dir=str(work_dir)),
        strategy=strategy,
        seed=seed,
    )


def tuned_pipeline(
    target: tvm.target.Target | str,
    work_dir: str | Path | None = None,
    fusion: str = "tvm",
) -> tvm.transform.Pass:
    """Our CPU pipeline with tuned schedules from ``work_dir`` where the database has them.

    Order after fusion: ``FuseTIR`` -> ``MetaScheduleApplyDatabase(work_dir)`` (tuned workloads,
    marked ``tirx.is_scheduled``) -> our rules (skip scheduled PrimFuncs, schedule the rest).
    """
    target = tvm.target.Target(target)
    work_dir = Path(work_dir) if work_dir is not None else target_dir(target)
    if not (work_dir / "database_tuning_record.json").exists():
        raise FileNotFoundError(f"no tuning database in {work_dir}: run tune_model first")
    with target:  # the pass reads Target.current() when it is created
        apply_db = relax.transform.MetaScheduleApplyDatabase(str(work_dir))
    schedules = tvm.transform.Sequential([apply_db, schedule_pass(target)], name="TunedSchedules")
    return build_pipeline(target, fusion_pass(fusion, target), schedules)
