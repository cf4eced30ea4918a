"""How a kernel is built, per target kind: one record each, so that a model's build, the
feedback loop timing one kernel alone, and the check that each kernel got the rule its card
names all choose the same way.

- CPU (llvm): TVM's ``cpu_generic`` pass sequence; our rules (``cpu.rules()``, first that
  applies wins, as dlight's ``ApplyDefaultSchedule``), constant weights packed around them,
  then :func:`finish_pass`; an unscheduled kernel builds as plain loops;
- CUDA: TVM's ``cuda`` pass sequence; dlight's GPU rules in TVM's order, each guarded
  (``cuda.py``); nothing after them; a kernel without thread bindings does not build.

A target kind without a record (``c``, ``rocm``...) is refused by :func:`backend` with a
message naming it. The cost model's per-kind figures sit beside the formulas that read them
(``cost/analytical.py``), the runners and register readers beside theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import tvm
from tvm import s_tir, tirx
from tvm.relax.backend import cpu_generic as _cpu_relax
from tvm.relax.backend import cuda as _cuda_relax
from tvm.s_tir import dlight as dl
from tvm.target import Target

from . import cuda
from ._loops import int32_partition_loops
from .cpu import rules
from .fast_math import fast_math_pass
from .math_calls import scalar_math_loops
from .prepack import mark_constant_weights, pack_constants

__all__ = ["Backend", "backend", "finish_pass", "first_rule", "schedule_pass"]


def schedule_pass(target: Target, prepack: bool = True,
                  fast_math: bool = True) -> tvm.transform.Pass:
    """``ApplyDefaultSchedule`` with the CPU rules; run it after FuseTIR under ``with target``.

    Around it, constant contraction weights are marked and then packed tile-major at compile
    time (``prepack``). The marking comes after any tuned schedules were applied (they match
    their database records by the unmarked PrimFunc) and the rules skip scheduled PrimFuncs.
    ``prepack=False`` leaves every weight in its own layout (``lab/prepack_effect.py``).
    Last, float32 exp/log/tanh/sigmoid/erf calls in every kernel become vectorizable
    expressions (``fast_math``; ``fast_math=False`` keeps the scalar libm calls, for
    comparisons).
    """
    passes = [dl.ApplyDefaultSchedule(*rules())]
    if prepack:
        passes = [mark_constant_weights, *passes, pack_constants]
    passes.append(finish_pass(fast_math))
    return tvm.transform.Sequential(passes, name="CostFuseCPUSchedules")


def finish_pass(fast_math: bool = True) -> tvm.transform.Pass:
    """What every CPU kernel goes through after the rules scheduled it: the loops the rules
    hinted for partitioning (whole vectors and a tail) get int32 variables, so that TVM's
    loop partitioning peels their tails when the kernel is lowered, then the float32 math calls
    become vectorizable expressions. Anything that times a kernel alone (the feedback loop)
    applies it too, or it times scalar libm calls and guarded vector loops the model's build
    never runs. Last, a vectorized loop calling a math function LLVM cannot widen (sinh,
    cosh) becomes serial again."""
    passes = [int32_partition_loops] + ([fast_math_pass] if fast_math else [])
    passes.append(scalar_math_loops)  # what has no vector form stays a scalar loop
    return tvm.transform.Sequential(passes, name="CostFuseCPUFinish")


def _finish_cpu(func: tirx.PrimFunc) -> tirx.PrimFunc:
    return finish_pass()(tvm.IRModule({"main": func}))["main"]


@dataclass(frozen=True)
class Backend:
    """How kernels are built and scheduled on one target kind."""

    #: TVM's relax backend for the kind (``legalize_passes``, ``finalize_passes``...)
    relax: ModuleType
    #: a kernel must be scheduled to build (thread bindings), so "no schedule" means ours
    needs_schedule: bool
    #: the rules in policy order (first that applies wins)
    rules: Callable[[], list[dl.ScheduleRule]]
    #: the pass applying them to a whole module after FuseTIR
    schedule_pass: Callable[[Target], tvm.transform.Pass]
    #: what one scheduled (or unscheduled) kernel goes through after the rules
    finish: Callable[[tirx.PrimFunc], tirx.PrimFunc]


_BACKENDS = {
    "llvm": Backend(_cpu_relax.pipeline, False, rules, schedule_pass, _finish_cpu),
    "cuda": Backend(_cuda_relax.pipeline, True,
                    lambda: [cuda.GuardedRule(r) for r in cuda.gpu_rules()], cuda.schedule_pass,
                    lambda func: func),
}


def backend(target: Target) -> Backend:
    """The :class:`Backend` of ``target``'s kind; ValueError for a kind CostFuse has none for."""
    kind = target.kind.name
    if kind not in _BACKENDS:
        raise ValueError(f"CostFuse supports {' and '.join(_BACKENDS)} targets, not {kind!r}")
    return _BACKENDS[kind]


def first_rule(func: tirx.PrimFunc, target: Target
               ) -> tuple[dl.ScheduleRule | None, s_tir.Schedule | None]:
    """The rule the target's schedule pass schedules ``func`` with, and its schedule ((None,
    None) when none applies): what the card the cost model chose is checked against
    (``tests/test_rule_fidelity.py``), and what the feedback loop times."""
    for rule in backend(target).rules():
        sch = rule.apply(func, target, False)
        sch = (sch[0] if sch else None) if isinstance(sch, list) else sch
        if sch is not None:
            return rule, sch
    return None, None
