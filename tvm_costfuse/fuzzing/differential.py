"""Differential check of a grouping: built with our schedules for a target, compared with the
unfused, unscheduled build of the same program (TVM's own kernels on generic x86-64).

Groupings are the ones FuseOps never forms, drawn on purpose, next to the planner's own:
- ``costfuse``: the CostFuse pass under random caps, search and cost model;
- ``intervals``: a random topological order cut into intervals (convex by construction:
  multi-reduction kernels, reductions with epilogues, fan-in and fan-out groups);
- ``whole``: every fusable binding between two unfusable ones in one group;
- ``siblings``: pairs of bindings reading one tensor, with no path between them (horizontal);
- ``fuseops``: TVM's FuseOps, as the control.

Targets: generic x86-64 (runs everywhere), AVX2 and AVX-512 (tile sizes follow the vector
width). A target this host cannot execute is still built: a build failure is a failure.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from ..graph import OpGraph, build_graph
from ..measurement.timing import SCALED_TOLERANCE, build, run, scaled_error
from ..partition import apply_partition
from ..pipelines import prepare, scheduled_pipeline
from ..strategies import fusion_pass, tir_pipeline
from ..targets import host_target
from .programs import Draws, Program

TARGETS = {
    "generic": {"kind": "llvm", "num-cores": 2},
    "avx2": {"kind": "llvm", "mcpu": "haswell", "num-cores": 2},
    "avx512": {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2},
}
# The CPU flag each target's code needs to run here.
_NEEDS = {"generic": None, "avx2": "avx2", "avx512": "avx512f"}
GROUPINGS = ("costfuse", "intervals", "whole", "siblings", "fuseops")
TOLERANCE = SCALED_TOLERANCE  # of the output's largest magnitude (``timing.scaled_error``)
# An output smaller than this share of the inputs' largest magnitude is judged against that
# share instead: a random program's output can cancel to zero (``mean(mean(x)) - mean(x)``
# gave 0.0 in the reference and 5e-8 under a fused multiply-add, inputs of magnitude 2.6),
# while a wrong kernel is off by far more than 1e-4 of it.
CANCELLED = 1e-2


def host_flags() -> set[str]:
    """The CPU flags of this host (Linux ``/proc/cpuinfo``; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def runs_here(target_name: str) -> bool:
    need = _NEEDS[target_name]
    return need is None or need in host_flags()


def intervals(graph: OpGraph, draws: Draws, mean_len: int | None = None) -> list[list[str]]:
    """Cut a random topological order into intervals (each interval of a topological order is
    convex); an unfusable binding always ends one. ``mean_len`` huge: whole intervals."""
    pending = {n.name: len(graph.producers(n.name)) for n in graph.nodes}
    ready = [n for n, k in pending.items() if k == 0]
    mean_len = mean_len or draws.int(1, 8)
    groups: list[list[str]] = [[]]
    while ready:
        name = ready.pop(draws.int(0, len(ready) - 1))
        for c in graph.consumers.get(name, ()):
            pending[c] -= 1
            if pending[c] == 0:
                ready.append(c)
        if not graph[name].fusable:
            groups.append([])
            continue
        groups[-1].append(name)
        if mean_len < 10**6 and draws.int(0, mean_len - 1) == 0:
            groups.append([])
    return [g for g in groups if g]


def _reaches(graph: OpGraph, src: str, dst: str) -> bool:
    stack, seen = [src], set()
    while stack:
        n = stack.pop()
        if n == dst:
            return True
        if n not in seen:
            seen.add(n)
            stack.extend(graph.consumers.get(n, ()))
    return False


def siblings(graph: OpGraph, draws: Draws) -> list[list[str]]:
    """Disjoint pairs of fusable bindings that read one tensor and do not reach each other."""
    groups, taken = [], set()
    readers: dict[str, list[str]] = {}
    for n in graph.nodes:
        if n.fusable and n.kind == "call_tir":
            for src in n.inputs:
                readers.setdefault(src, []).append(n.name)
    for names in readers.values():
        free = [n for n in names if n not in taken]
        for a, b in zip(free[::2], free[1::2]):
            if a in taken or b in taken:  # an earlier pair took it as an epilogue
                continue
            if not (_reaches(graph, a, b) or _reaches(graph, b, a)) and not draws.coin(3):
                groups.append(_with_epilogues(graph, [a, b], taken, draws))
    return groups


def _with_epilogues(graph: OpGraph, group: list[str], taken: set[str],
                    draws: Draws) -> list[str]:
    """``group`` plus some of its members' epilogues: consumers whose only producer is in the
    group (a path into one passes through the group, so the group stays convex)."""
    taken.update(group)
    for name in list(group):
        for c in graph.consumers.get(name, ()):
            if (c not in taken and graph[c].fusable and graph.producers(c) == (name,)
                    and not draws.coin(4)):
                group.append(c)
                taken.add(c)
    return group


class BuildFailure(RuntimeError):
    """A drawn program failed to build under a drawn case; the message says which."""


class _RuleLog(logging.Handler):
    """Collects what the schedule rules' guard logs when a rule raises: the kernel then falls
    to the next rule and still runs right, so only this record shows the rule's bug."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def _rules_raising():
    log = logging.getLogger("tvm_costfuse.schedules._loops")
    handler = _RuleLog()
    log.addHandler(handler)
    try:
        yield handler.messages
    finally:
        log.removeHandler(handler)


@dataclass(frozen=True)
class Case:
    """One differential check: which grouping, for which target, under which options."""

    grouping: str
    target: str
    options: tuple = ()

    def __str__(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.options)
        return f"{self.grouping} on {self.target}" + (f" ({opts})" if opts else "")


def draw_case(draws: Draws) -> Case:
    grouping = draws.pick(GROUPINGS[:-1] + ("costfuse", "intervals"))
    target = draws.pick(tuple(TARGETS))
    options: tuple = ()
    if grouping == "costfuse":
        options = (("max_chain_length", draws.int(1, 40)), ("max_body_ops", draws.int(1, 80)),
                   ("search", draws.pick(("greedy", "exact"))),
                   ("cost_model", draws.pick(("analytical", "xgb"))))
    return Case(grouping, target, options)


def _fusion(case: Case, prepared: tvm.IRModule, target, draws: Draws):
    """The fused module (``prepared`` regrouped) or the fusion pass for ``case``."""
    if case.grouping == "costfuse":
        return None, fusion_pass("costfuse", target, **dict(case.options))
    if case.grouping == "fuseops":
        return None, relax.transform.FuseOps()
    graph = build_graph(prepared)
    if case.grouping == "intervals":
        groups = intervals(graph, draws)
    elif case.grouping == "whole":
        groups = intervals(graph, draws, mean_len=10**6)
    else:
        groups = siblings(graph, draws)
    return apply_partition(prepared, groups), None


def reference(program: Program) -> list[np.ndarray]:
    """The program's outputs from TVM's own kernels, unfused, unscheduled, unfolded (the batch
    norms as written: weight folding is under test too) and lowered by TVM's own TIR pipeline
    (ours is under test too), built for this host's CPU; for generic x86-64 where that build
    fails. TVM's unscheduled build is not
    infallible either: a lone silu over (1, 4, 2, 5) fails LLVM's verifier for generic
    x86-64 ("Instruction does not dominate all uses"), where it builds for the host."""
    errors = []
    for target in (host_target(), tvm.target.Target(TARGETS["generic"])):
        try:
            ex = build(prepare(program.mod, target, fold=False), target, tir="default")
        except Exception as err:  # noqa: BLE001 -- TVM's own build: try the next target
            errors.append(f"{target}: {str(err).strip().splitlines()[0]}")
            continue
        return run(ex, program.inputs)
    raise BuildFailure("no reference: TVM's unfused build failed (" + "; ".join(errors)
                       + f"); {program.describe()}")


def check(program: Program, case: Case, draws: Draws,
          want: list[np.ndarray] | None = None) -> float | None:
    """Build ``program`` under ``case``; the largest scaled error of its outputs, or None where
    the target cannot run on this host (built only). Raises AssertionError on a mismatch and
    lets a build failure raise."""
    target = tvm.target.Target(TARGETS[case.target])
    prepared = prepare(program.mod, target)
    fused, fusion = _fusion(case, prepared, target, draws)
    if fused is not None:
        from ..strategies import no_fusion

        mod, fusion = fused, no_fusion  # already grouped: FuseTIR makes the kernels
    else:
        mod = prepared
    try:
        with _rules_raising() as raised:
            ex = tvm.compile(mod, target=target,
                             relax_pipeline=scheduled_pipeline(target, fusion),
                             tir_pipeline=tir_pipeline())
    except Exception as err:  # any build failure is a finding: say what was built
        first = next((ln for ln in str(err).splitlines() if ln.strip()), type(err).__name__)
        raise BuildFailure(f"{case}: build failed: {first}; {program.describe()}") from err
    if raised:
        raise BuildFailure(f"{case}: {raised[0]}; {program.describe()}")
    if not runs_here(case.target):
        return None
    got = run(ex, program.inputs)
    want = want if want is not None else reference(program)
    assert len(got) == len(want), f"{len(got)} outputs, expected {len(want)}"
    worst = 0.0
    floor = CANCELLED * max((float(np.abs(v).max()) for v in program.inputs.values()
                             if v.size), default=0.0)
    for g, w in zip(got, want):
        assert g.shape == w.shape, f"output shape {g.shape}, expected {w.shape}"
        worst = max(worst, scaled_error(g, w, max(floor, 1e-30)))
    assert worst <= TOLERANCE, (f"{case}: scaled error {worst:.3g} > {TOLERANCE}; "
                                f"{program.describe()}")
    return worst
