"""Our strategies next to the peers a user would pick, at equal threads: ``costfuse bench``.

Per model and thread count ``t``, in one process with interleaved timing rounds
(``timing.interleave``: every column sampled once per round, so a shared machine's drift hits
all alike): kernels launched and ms under our strategies (same schedules, built with
``num-cores = t`` and TVM's thread pool sized ``t``), PyTorch eager with
``torch.set_num_threads(t)`` where the model has a PyTorch form (corpus names, ``.pt2`` files),
ONNX Runtime (CPU provider, ``intra_op_num_threads = t``) on the ``.onnx`` file or the
model exported to one, and on request ``torch.compile`` (Inductor, compiled at ``t``
threads). Every column's output is checked against PyTorch's, or against our unfused build
where there is no PyTorch form (max |got - want| / max |want|).

Before each sample that follows another runtime's (ours, PyTorch, ONNX Runtime, Inductor) the
machine is left idle for :data:`~..measurement.peers.SETTLE_S`, so that no runtime's
spinning pool taxes the column after it.

Each row records the cores other processes used while it was timed (``measurement.quiet``);
a row above :data:`DISTURBED_CORES` is marked, to be rerun on a quiet machine. At 2+ threads a
launch probe runs before each sample of ours (``measurement.placement``), and the rounds in
which one read apart (the two vCPUs on cores without a shared cache) are left out of every
column, as ``time_builds`` leaves them out. The table is :mod:`.bench_table`'s.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm

from .. import models
from ..huge_pages import collapse
from ..measurement.peers import (
    SAMPLE_MS,
    SETTLE_S,
    compiled_call,
    eager_sampler,
    first_output,
    ort_session,
    thread_pool,
    with_threads,
)
from ..measurement.placement import launch_probe, near_rounds, probed
from ..measurement.quiet import OtherLoad
from ..measurement.timing import call_sampler, interleave, run, scaled_error, vm_sampler
from ..strategies import strategy_pipeline, tir_pipeline
from ..targets import host_target
from .bench_table import DISTURBED_CORES, disturbed, speedup, table
from .cells import is_shape_func

__all__ = ["DEFAULT_PEERS", "DISTURBED_CORES", "OURS", "PEERS", "Workload", "bench", "disturbed",
           "speedup", "table", "workload"]  # the table's names from ``bench_table``

OURS = ("none", "tvm", "costfuse")
PEERS = ("eager", "ort", "compile")
#: The peers timed unless others are asked for (``compile`` spends minutes compiling a model).
DEFAULT_PEERS = ("eager", "ort")
_NO_TORCH = "no PyTorch form (a corpus name or a .pt2 has one)"


@dataclass
class Workload:
    """A model in every form the columns need: Relax for ours, a PyTorch callable for eager
    (None: no PyTorch form), an ONNX file or a function writing one to a path (None: no ORT),
    the PyTorch module and its inputs for ``torch.compile`` (None: no PyTorch form)."""

    name: str
    family: str
    mod: tvm.IRModule
    inputs: dict[str, np.ndarray]
    eager: Callable[[], object] | None = None
    onnx: str | Callable[[str], None] | None = None
    torch_call: tuple | None = None  # (module, args)


def workload(spec: str, small: bool = False) -> Workload:
    """The :class:`Workload` of a corpus name, a ``.pt2`` or ``.onnx`` file, or any other
    model ``models.load`` takes (ours only). A ``.pt2``'s eager column runs
    ``ExportedProgram.module()``, which checks its inputs on every call (about 1.5 ms on a
    2-core host): what running the file costs, not what the original ``nn.Module`` would."""
    if spec in models.corpus_names():
        from ..models import corpus

        mod, inputs, module = corpus.load(spec, small=small)
        args = corpus.torch_inputs(inputs)
        return Workload(spec, corpus.family(spec), mod, inputs, lambda: module(*args),
                        lambda path: _export_onnx(module, args, list(inputs), path),
                        (module, args))
    mod, inputs = models.load(spec, small=small)
    if spec.endswith(".onnx"):
        return Workload(os.path.basename(spec), "onnx", mod, inputs, onnx=spec)
    if spec.endswith(".pt2"):
        import torch

        program = torch.export.load(spec)
        module = program.module()
        args = tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in inputs.values())

        def to_onnx(path: str) -> None:  # the program as it is, by torch's dynamo exporter
            torch.onnx.export(program, args, path, input_names=list(inputs), dynamo=True,
                              verbose=False)

        return Workload(os.path.basename(spec), "pt2", mod, inputs, lambda: module(*args),
                        to_onnx, (module, args))
    return Workload(spec, "-", mod, inputs)


def _export_onnx(module, args, names: list[str], path: str) -> None:
    import torch

    # nn.MultiheadAttention's inference fast path is one fused op that has no ONNX export;
    # off, the layer exports as its plain ops (eager keeps the fast path for its column).
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad():
            torch.onnx.export(module, args, path, input_names=names, opset_version=17,
                              dynamo=False)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


def bench(w: Workload, threads: list[int], repeat: int, tmp: str, ours=OURS, peers=DEFAULT_PEERS,
          timed_at: Callable[[int], None] | None = None, huge_pages: bool = False) -> dict:
    """One model's row: kernels per strategy, and per thread count ms and error per column;
    ``timed_at(t)`` is called as each thread count's columns are timed (a progress bar).
    ``huge_pages``: every column's resident memory moved to 2 MiB pages before it is timed
    (``tvm_costfuse.huge_pages``; what moved, per thread count, is the row's ``pages``)."""
    row: dict = {"model": w.name, "family": w.family, "kernels": {}, "ms": {}, "failed": {},
                 "err": {}, "other_load": {}, "probe_s": {}}
    ref = None
    if "eager" in peers and w.eager is not None:
        import torch

        with torch.inference_mode():
            ref = first_output(w.eager())
    elif "eager" in peers:
        row["failed"]["eager"] = _NO_TORCH
    if "compile" in peers and w.torch_call is None:
        row["failed"]["compile"] = _NO_TORCH
    if ref is None:  # no PyTorch: our unfused, unfolded build is the reference
        ref = run(tvm.compile(w.mod, target=host_target(),
                              relax_pipeline=strategy_pipeline("none", host_target(),
                                                               fold=False),
                              tir_pipeline="default"),
                  w.inputs)[0]
    # an export of its own per row: ``tmp`` is shared by every model of a run
    onnx_path = w.onnx if isinstance(w.onnx, str) else os.path.join(
        tempfile.mkdtemp(dir=tmp), "model.onnx")
    for t in threads:
        target = host_target(t)
        thread_pool(t)
        samplers: dict[str, Callable[[], float]] = {}
        # Before each sample of ours at 2+ threads: how near the CPUs sat (``placement``).
        probe = launch_probe(t) if t > 1 else None
        probes: dict[str, list[float]] = {}
        for s in ours:
            ex = tvm.compile(w.mod, target=target, relax_pipeline=strategy_pipeline(s, target),
                             tir_pipeline=tir_pipeline(s))
            calls: list[str] = []
            out = run(ex, w.inputs, calls=calls)
            row["kernels"][s] = sum(not is_shape_func(c) for c in calls)
            row["err"][f"{s}@{t}"] = scaled_error(out[0], ref)
            sampler = with_threads(vm_sampler(ex, w.inputs, min_ms=SAMPLE_MS), t)
            samplers[f"{s}@{t}"] = (probed(sampler, probe, probes.setdefault(f"{s}@{t}", []))
                                    if probe else sampler)
        if "eager" in peers and w.eager is not None:
            samplers[f"eager@{t}"] = eager_sampler(w.eager, t)
        if "compile" in peers and "compile" not in row["failed"]:
            try:  # a model Inductor cannot compile costs the column, not the row
                import torch

                call = compiled_call(*w.torch_call, t)
                with torch.inference_mode():
                    row["err"][f"compile@{t}"] = scaled_error(first_output(call()), ref)
            except Exception as err:  # noqa: BLE001 -- reported in the row and the table
                lines = str(err).splitlines() or [""]
                row["failed"]["compile"] = f"{type(err).__name__}: {lines[0]}"[:160]
            else:
                samplers[f"compile@{t}"] = eager_sampler(call, t)
        if "ort" in peers and "ort" not in row["failed"]:
            try:  # an export or a session ORT refuses costs the ORT column, not the row
                if w.onnx is None:
                    raise ValueError("no ONNX form (an .onnx file, a corpus name or a .pt2 "
                                     "has one)")
                if not isinstance(w.onnx, str) and not os.path.exists(onnx_path):
                    w.onnx(onnx_path)
                sess = ort_session(onnx_path, t)
                feed = {i.name: a
                        for i, a in zip(sess.get_inputs(), w.inputs.values(), strict=True)}
                row["err"][f"ort@{t}"] = scaled_error(sess.run(None, feed)[0], ref)
            except Exception as err:  # noqa: BLE001 -- reported in the row and the table
                lines = str(err).splitlines() or [""]
                row["failed"]["ort"] = f"{type(err).__name__}: {lines[0]}"[:160]
            else:
                samplers[f"ort@{t}"] = call_sampler(
                    lambda sess=sess, feed=feed: sess.run(None, feed), SAMPLE_MS)
        if huge_pages:  # after every column is built and has run once: all of them alike
            row.setdefault("pages", {})[str(t)] = collapse().describe()
        with OtherLoad() as load:
            timed = interleave(samplers, repeat, SETTLE_S,
                               lambda k: "tvm" if k.split("@")[0] in ours else k)
        row["other_load"][str(t)] = load.cores
        if probe:
            timed = _near(row, t, timed, probes)
        for k, v in timed.items():
            row["ms"][k] = float(np.median(v)) * 1e3
        if timed_at is not None:
            timed_at(t)
    return row


def _near(row: dict, t: int, timed: dict[str, list[float]], probes: dict[str, list[float]],
          ) -> dict[str, list[float]]:
    """``timed`` without the rounds in which a sample of ours was taken with the CPUs apart
    (``placement.near_rounds``, as ``time_builds`` leaves them out: a stretch apart slows plans
    of many small parallel kernels and the peers' pools unlike each other, so it does not
    cancel across a round), how many recorded in the row's ``left_out``; the kept rounds'
    probes go to ``probe_s``, which the table checks against the whole run's fastest: read
    against the row's own fastest probe, whose round always stays, a row taken apart
    throughout keeps every round."""
    near, left_out = near_rounds(timed, probes)
    kept, _ = near_rounds(probes, probes)
    rounds = len(next(iter(kept.values())))
    row["probe_s"][str(t)] = [p[r] for r in range(rounds) for p in kept.values()]
    if left_out:
        row.setdefault("left_out", {})[str(t)] = left_out // len(timed)
    return near
