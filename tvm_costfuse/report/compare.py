"""``costfuse compare``: models x fusion strategies x targets, side by side.

Per (model, strategy, target) one :class:`Cell`: kernels launched and bytes of intermediates
written to global memory (``explain.kernels_of`` / ``explain.intermediate_bytes`` over the
strategy's partition, planned once and built as planned with ``ApplyPartition``; on a measured
target the kernels one run launches are counted and must match; the VM's shape functions of a
model with symbolic shapes are not kernels, and a note says what such a model's figures leave
out), the analytical model's
predicted time for that partition (``planner.plan_cost``), the roofline bound of the model on the target, and -- where the target
is present -- the measured time (all strategies of a model timed interleaved, ``measurement.timing``) with
numerics checked against the ``none`` strategy. Register and spill figures come from the backend
compilers: ptxas per CUDA kernel, LLVM's x86 spill comments per CPU kernel (``registers``).
CUDA is compiled offline (no GPU needed, ``nvcc`` for registers); it is measured only when a GPU
is present.

A cell that cannot be computed (unknown strategy, a module that fails to compile, no trained
learned model) is a failed cell carrying its error: the run never stops for one of them.
:func:`compare` writes ``compare.csv``, ``kernels.csv``, ``compare.md`` and PNG plots.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import tvm

from .. import models
from ..config import FusionConfig, register_config_keys
from ..cost.extract import group_features
from ..graph import OpGraph, build_graph
from ..measurement.timing import interleaved_medians, max_mismatch, run
from ..partition import ApplyPartition, fuseops_groups
from ..pipelines import prepare
from ..planner import plan_cost
from ..pre_fusion import costfuse_model
from ..rules import rules_groups
from ..strategies import split_strategy, strategy_pipeline, tir_pipeline
from ..targets import Target, TargetDesc, resolve
from ..transform import plan_module
from .cells import Cell, is_shape_func, kernel_regs
from .explain import intermediate_bytes, kernels_of
from .plots import plot_registers, plot_speedup
from .tables import markdown_table, write_csv, write_kernels_csv

__all__ = ["COMPARED", "TARGETS", "Cell", "compare", "markdown_table"]

COMPARED = ("none", "tvm", "rules", "costfuse", "costfuse-xgb")
TARGETS = ("llvm", "cuda")
# Outputs within timing.max_mismatch's tolerance (rtol 1e-4, atol 1e-5) count as equal.
_MISMATCH_OK = 1.0
# Failed cells keep this much of the error (the first line names the exception).
_ERROR_CHARS = 400


# ---------------------------------------------------------------------------------- inputs
def expand_models(specs: Iterable[str]) -> list[str]:
    """Model specs with ``all`` expanded to the zoo and ``corpus`` to the real-model corpus,
    duplicates dropped."""
    out: list[str] = []
    for m in specs:
        out += (models.zoo.names() if m == "all" else models.corpus_names() if m == "corpus"
                else [m])
    return list(dict.fromkeys(out))


# ---------------------------------------------------------------------------- strategies
def _split(strategy: str) -> tuple[str, dict]:
    """:func:`strategies.split_strategy` for the strategies compare runs; others raise."""
    if strategy not in COMPARED:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(COMPARED)}")
    return split_strategy(strategy)


def strategy_groups(strategy: str, prepared: tvm.IRModule, graph: OpGraph,
                    desc: TargetDesc) -> list[list[str]]:
    """The partition ``strategy`` fuses (groups of binding names), without building."""
    base, config = _split(strategy)
    cfg = FusionConfig.resolve(**config)
    if base == "none":
        return []
    if base == "tvm":
        return fuseops_groups(prepared)
    if base == "rules":
        return rules_groups(graph, cfg)
    return [list(g) for g in plan_module(prepared, desc, cfg).groups]


def _pipeline(strategy: str, target: Target, groups: list[list[str]]):
    """The strategy's pipeline for a resolved target (its own description prices the plan);
    a planned strategy builds the partition ``groups`` it was reported with (planned once, by
    :func:`strategy_groups`), FuseOps and none run as they are."""
    base, config = _split(strategy)
    fusion = ApplyPartition(groups) if base in ("rules", "costfuse") else None
    return strategy_pipeline(base, target, fusion=fusion, **config)


# ------------------------------------------------------------------------------- targets
@dataclass(frozen=True)
class _Target:
    """A target as compare runs it: the resolved target, and whether it is timed here."""

    name: str  # "llvm" or "cuda"
    target: Target
    measured: bool
    note: str = ""

    @property
    def desc(self) -> TargetDesc:
        return self.target.desc

    @property
    def tvm_target(self) -> tvm.target.Target:
        return self.target.tvm

    @property
    def device(self):
        return self.target.device()


def _targets(names: Sequence[str], gpu: str, measure_cuda: bool | None) -> list[_Target]:
    out = []
    for name in names:
        if name not in TARGETS:
            raise ValueError(f"unknown target {name!r}; choose from {', '.join(TARGETS)}")
        target = resolve(name, gpu=gpu)
        present = bool(target.device().exist)  # the host CPU always is
        want = measure_cuda if measure_cuda is not None and target.kind == "cuda" else present
        note = "" if present or not want else "no GPU present: not measured"
        out.append(_Target(name, target, want and present, note))
    return out


def roofline(graph: OpGraph, desc: TargetDesc) -> tuple[float, int, float]:
    """(FLOPs, compulsory bytes, bound seconds) of the whole model on ``desc``: the model as
    one kernel reads its inputs and weights and writes its outputs once."""
    calls = [n.name for n in graph.nodes if n.kind == "call_tir"]
    if not calls:
        return 0.0, 0, 0.0
    f = group_features(graph, calls)
    dtype = next((t.dtype for n in graph.nodes for t in n.outputs), "float32")
    nbytes = f.bytes_in + f.bytes_out
    return f.flops, nbytes, max(f.flops / desc.peak(dtype), nbytes / desc.dram_bw)


# ------------------------------------------------------------------------------- compare
def symbolic_note(graph: OpGraph) -> str:
    """What a model with symbolic shapes (a dynamic batch) reports differently, or "": the
    cost model cannot size those ops (their tensors count as 0 bytes in the bytes and times
    predicted, and CostFuse leaves them to FuseOps), while the run uses the example inputs'
    shapes. Without the note its figures would read as a static model's."""
    calls = [n for n in graph.nodes if n.kind == "call_tir"]
    n = sum(any(t.nbytes is None for t in node.outputs) for node in calls)
    if not n:
        return ""
    return (f"symbolic shapes: {n} of {len(calls)} ops unsized (0 bytes in the predictions), "
            "measured at the example inputs' shapes")


def _error(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    # TVM errors carry a C++ backtrace first; keep the message lines at the end.
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) > 3:
        lines = lines[:1] + lines[-2:]
    return " | ".join(lines)[:_ERROR_CHARS]


def _model_cells(spec: str, strategies: Sequence[str], targets: Sequence[_Target], small: bool,
                 repeat: int, tick: Callable[[str], None]) -> list[Cell]:
    try:
        name = models.display_name(spec)
        mod, inputs = models.load(spec, small=small)
    except Exception as err:  # noqa: BLE001 -- a model that cannot load fails its cells
        msg = _error(err)
        for _ in range(len(strategies) * len(targets)):
            tick(spec)
        return [Cell(spec, s, t.name, error=f"load: {msg}") for t in targets for s in strategies]
    cells: list[Cell] = []
    for t in targets:
        cells += _target_cells(name, mod, inputs, strategies, t, repeat, tick)
    return cells


def _strategy_input(strategy: str, mod, prepared, graph, t: _Target):
    """(model, prepared module, graph) a strategy plans and builds: CostFuse's after its
    sibling step (:func:`~tvm_costfuse.pre_fusion.costfuse_model`), the others' as given."""
    base, config = _split(strategy)
    if base != "costfuse":
        return mod, prepared, graph
    smod, _sets, _layout = costfuse_model(mod, t.target, fold=config.get("fold", True),
                                          **{k: v for k, v in config.items() if k != "fold"})
    sprepared = prepare(smod, t.tvm_target, fold=False)  # costfuse_model folded it
    return smod, sprepared, build_graph(sprepared)


def _target_cells(name, mod, inputs, strategies, t: _Target, repeat, tick) -> list[Cell]:
    cells: dict[str, Cell] = {}
    built: dict[str, object] = {}
    try:
        prepared = prepare(mod, t.tvm_target)
        graph = build_graph(prepared)
        flops, min_bytes, bound = roofline(graph, t.desc)
        cell_note = "; ".join(x for x in (t.note, symbolic_note(graph)) if x)
    except Exception as err:  # noqa: BLE001
        for s in strategies:
            tick(f"{name}/{t.name}")
        return [Cell(name, s, t.name, error=f"prepare: {_error(err)}") for s in strategies]
    cfg = FusionConfig.resolve()
    for s in strategies:
        tick(f"{name}/{s}/{t.name}")
        base = Cell(name, s, t.name, flops=flops, min_bytes=min_bytes, roofline_s=bound,
                    note=cell_note)
        stage = "plan"
        try:
            smod, sprepared, sgraph = _strategy_input(s, mod, prepared, graph, t)
            groups = strategy_groups(s, sprepared, sgraph, t.desc)
            kernels = kernels_of(sgraph, groups)
            base = replace(base, kernels=len(kernels),
                           intermediate_bytes=intermediate_bytes(sgraph, kernels),
                           predicted_s=plan_cost(sgraph, t.desc, cfg, groups))
            stage = "compile"
            start = time.perf_counter()
            with t.tvm_target:
                ex = tvm.compile(smod, target=t.tvm_target,
                                 relax_pipeline=_pipeline(s, t.target, groups),
                                 tir_pipeline=tir_pipeline(s))
            base = replace(base, compile_s=time.perf_counter() - start)
            stage = "registers"
            regs, note = kernel_regs(ex, t.target.kind)
            known = [r.registers for r in regs if r.registers is not None]
            base = replace(
                base, kernel_regs=regs, built_kernels=len(regs) or None,
                max_registers=max(known) if known else None,
                spilling_kernels=sum(r.spill_bytes > 0 for r in regs) if regs else None,
                spill_bytes=sum(r.spill_bytes for r in regs) if regs else None,
                note="; ".join(x for x in (base.note, note) if x))
            built[s] = ex
            cells[s] = base
        except Exception as err:  # noqa: BLE001 -- one strategy's failure is one cell
            cells[s] = replace(base, error=f"{stage}: {_error(err)}")
    if t.measured:
        _measure(cells, built, mod, inputs, t, repeat)
    return [cells[s] for s in strategies]


def _measure(cells: dict[str, Cell], built: dict, mod, inputs, t: _Target, repeat: int) -> None:
    """Numerics against ``none`` (built here when not compared), then interleaved timing."""
    ref_ex = built.get("none")
    try:
        if ref_ex is None:
            with t.tvm_target:
                ref_ex = tvm.compile(mod, target=t.tvm_target,
                                     relax_pipeline=_pipeline("none", t.target, []),
                                     tir_pipeline="default")
        ref = run(ref_ex, inputs, t.device)
    except Exception as err:  # noqa: BLE001
        for s in built:
            cells[s] = replace(cells[s], note=f"no reference (none failed: {_error(err)})")
        ref = None
    timed = {}
    for s, ex in built.items():
        calls: list[str] = []
        try:
            out = run(ex, inputs, t.device, calls)
        except Exception as err:  # noqa: BLE001
            cells[s] = replace(cells[s], error=f"run: {_error(err)}")
            continue
        launched = sum(not is_shape_func(c) for c in calls)
        cells[s] = replace(cells[s], launched_kernels=launched)
        if launched != cells[s].kernels:  # the reported plan must be the built one
            cells[s] = replace(cells[s], error=f"plan: reports {cells[s].kernels} kernels, the "
                               f"built module launches {launched}")
            continue
        if ref is not None:
            err_ = max_mismatch(ref, out)
            cells[s] = replace(cells[s], max_mismatch=err_,
                               numerics="ok" if err_ <= _MISMATCH_OK else "MISMATCH")
        timed[s] = ex
    if not timed:
        return
    try:
        medians = interleaved_medians(timed, inputs, repeat=repeat, device=t.device)
    except Exception as err:  # noqa: BLE001
        for s in timed:
            cells[s] = replace(cells[s], note=f"timing failed: {_error(err)}")
        return
    for s, sec in medians.items():
        c = cells[s]
        cells[s] = replace(c, measured_s=sec,
                           roofline_fraction=c.roofline_s / sec if c.roofline_s else None)


def _progress(total: int, enabled: bool):
    """A tqdm bar (a plain counter on stderr when tqdm is missing)."""
    try:
        from tqdm import tqdm

        return tqdm(total=total, disable=not enabled, unit="cell", dynamic_ncols=True)
    except ImportError:
        import sys

        class _Plain:
            n = 0

            def set_description(self, text: str) -> None:
                if enabled:
                    print(f"[{self.n}/{total}] {text}", file=sys.stderr, flush=True)

            def update(self, k: int = 1) -> None:
                self.n += k

            def close(self) -> None:
                pass

        return _Plain()


def compare(
    specs: Sequence[str],
    strategies: Sequence[str] = ("none", "tvm", "rules", "costfuse"),
    targets: Sequence[str] = ("llvm",),
    out_dir: str | os.PathLike | None = None,
    *,
    small: bool = False,
    repeat: int = 5,
    gpu: str = "h200",
    measure_cuda: bool | None = None,
    progress: bool = True,
) -> list[Cell]:
    """Compile every model under every strategy for every target; measure where possible.

    Parameters
    ----------
    specs
        Zoo names (``"all"`` expands to the zoo), ``.onnx`` paths, or ``module:function``
        returning ``(torch.nn.Module, example_args)``.
    strategies
        From :data:`COMPARED`; other names become failed cells.
    targets
        ``"llvm"`` (this host, always measured) and/or ``"cuda"`` (``gpu``'s description,
        compiled offline; measured when a GPU is present, or never if ``measure_cuda=False``).
    out_dir
        When given, ``compare.csv``, ``kernels.csv``, ``compare.md`` and plots go there.
    repeat
        Interleaved timing rounds per model and target (median reported).

    Returns
    -------
    list of Cell
        Model-major, then target, then strategy.
    """
    register_config_keys()
    specs = expand_models(specs)
    tgts = _targets(targets, gpu, measure_cuda)
    bar = _progress(len(specs) * len(strategies) * len(tgts), progress)

    def tick(label: str) -> None:
        bar.set_description(label)
        bar.update(1)

    cells: list[Cell] = []
    try:
        for spec in specs:
            cells += _model_cells(spec, strategies, tgts, small, repeat, tick)
    finally:
        bar.close()
    if out_dir is not None:
        write_outputs(cells, out_dir)
    return cells


def write_outputs(cells: Sequence[Cell], out_dir: str | os.PathLike) -> list[str]:
    """CSV (cells and kernels), the markdown table and the plots into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(cells, out / "compare.csv")
    write_kernels_csv(cells, out / "kernels.csv")
    (out / "compare.md").write_text(markdown_table(cells))
    paths = [str(out / n) for n in ("compare.csv", "kernels.csv", "compare.md")]
    try:
        for t in dict.fromkeys(c.target for c in cells):
            if p := plot_speedup(cells, out / f"speedup_{t}.png", t):
                paths.append(p)
        if p := plot_registers(cells, out / "registers_cuda.png"):
            paths.append(p)
    except ImportError:  # matplotlib is an optional extra: tables still stand
        (out / "PLOTS_SKIPPED.txt").write_text(traceback.format_exc())
    return paths
