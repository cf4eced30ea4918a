"""The tools on what a probe fed them: a tuning folder that cannot be written, a features log
with lines that are JSON but not records, and a model with a symbolic (dynamic) batch.

Each case was a crash before: reading a read-only folder created ``.lock`` (EROFS), a ``[]``
line raised TypeError in every reader, ``tune`` wrote a workload line and then died on its
record, and ``compare`` counted the VM's shape function as a kernel and failed every cell.
"""

from __future__ import annotations

import builtins
import errno
import io
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import tvm
from test_learned import TARGET, _rows
from tvm import relax

from tvm_costfuse import models
from tvm_costfuse.cost import learned
from tvm_costfuse.cost.measured import load_measured
from tvm_costfuse.graph import build_graph
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.report.compare import compare
from tvm_costfuse.targets import host_target
from tvm_costfuse.records.database import GroupDatabase
from tvm_costfuse.tuning.feedback import (
    MeasureConfig,
    group_kernel,
    measure_model,
    refeature,
    schedule_kernel,
)
from tvm_costfuse.records.integrity import WORKLOAD_FILE, exclusive

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
NOT_RECORDS = [b"[]", b'{"x": 1}', b"42"]


def _log_rows(n: int) -> list[dict]:
    """Rows as the feedback loop writes them (enough to train on), with workload hashes."""
    return [{**r, "workload_hash": f"{i:016x}", "measured": True}
            for i, r in enumerate(_rows(n))]


def _write_log(folder: Path, rows: list[dict], extra: list[bytes] = ()) -> Path:
    """``features.jsonl`` holding ``rows``, then the ``extra`` lines as they are."""
    path = folder / "features.jsonl"
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows)
                     + b"".join(line + b"\n" for line in extra))
    return path


@pytest.fixture
def read_only(monkeypatch):
    """Make every write into a folder fail as on a read-only mount (tests run as root, so a
    chmod would not stop them): ``os.open`` with write flags, ``open`` for writing, mkdir,
    replace and truncate under it raise ``OSError(EROFS)``."""

    def guard(folder: Path) -> None:
        root = str(folder.resolve())

        def inside(path) -> bool:
            return isinstance(path, (str, os.PathLike)) and os.path.abspath(path).startswith(root)

        def refuse(path):
            raise OSError(errno.EROFS, "Read-only file system", str(path))

        def wrap_open(real):
            def opener(file, mode="r", *args, **kwargs):
                if inside(file) and any(c in mode for c in "wax+"):
                    refuse(file)
                return real(file, mode, *args, **kwargs)
            return opener

        real_os_open = os.open

        def os_open(path, flags, *args, **kwargs):
            if inside(path) and flags & _WRITE_FLAGS:
                refuse(path)
            return real_os_open(path, flags, *args, **kwargs)

        monkeypatch.setattr(os, "open", os_open)
        monkeypatch.setattr(builtins, "open", wrap_open(builtins.open))
        monkeypatch.setattr(io, "open", wrap_open(io.open))
        for name in ("mkdir", "replace", "truncate"):
            real = getattr(os, name)
            monkeypatch.setattr(os, name, lambda path, *a, _real=real, **k:
                                refuse(path) if inside(path) else _real(path, *a, **k))

    return guard


# ------------------------------------------------------------------ 1. read-only folders
def test_reading_a_tuning_folder_creates_no_file(tmp_path):
    _write_log(tmp_path, _log_rows(40))
    before = sorted(p.name for p in tmp_path.iterdir())
    assert len(GroupDatabase(tmp_path).rows()) == 40
    assert load_measured(TARGET, tmp_path).seconds
    assert learned.load_learned(TARGET, tmp_path).n_records == 40  # trained in memory
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no .lock, nothing


def test_a_read_only_folder_serves_the_measured_and_xgb_models(tmp_path, read_only):
    # Damage a writer would repair (a superseded row, a torn last line) is read around.
    rows = _log_rows(40)
    path = _write_log(tmp_path, rows + [rows[0]])
    path.write_bytes(path.read_bytes() + b'{"model": "m0", "memb')
    read_only(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    db = GroupDatabase(tmp_path)
    assert len(db.rows()) == 40 and db.repairs == []
    assert len(load_measured(TARGET, tmp_path).seconds) > 0
    assert learned.load_learned(TARGET, tmp_path).n_records == 40
    assert sorted(p.name for p in tmp_path.iterdir()) == before


# ------------------------------------------------------------------ 2. JSON, not records
def test_json_lines_that_are_not_records_are_skipped_with_one_warning(tmp_path, caplog):
    path = _write_log(tmp_path, _log_rows(2), NOT_RECORDS)
    # Another session writes the folder: a reader may not repair, it skips and says so.
    with (exclusive(tmp_path),
          caplog.at_level(logging.WARNING, logger="tvm_costfuse.records.database")):
        rows = GroupDatabase(tmp_path).rows()
        assert len(load_measured(TARGET, tmp_path).seconds) == 2
    assert [r["members"] for r in rows] == [["0"], ["1"]]
    warnings = [r.getMessage() for r in caplog.records if "not records" in r.getMessage()]
    assert len(warnings) == 2  # one per reader, each naming the file and every line
    assert all(str(path) in w and all(f"line {n}" in w for n in (3, 4, 5)) for w in warnings)


def test_tune_on_a_log_with_non_records_drops_them_and_keeps_a_backup(tmp_path):
    # What `costfuse tune` does: measure into the folder (the writer repairs first), retrain.
    path = _write_log(tmp_path, _log_rows(2), NOT_RECORDS)
    mod = prepare(models.load("rmsnorm", small=True)[0])
    summary = measure_model("rmsnorm@small", mod, host_target(), tmp_path,
                            MeasureConfig(isolate=False), groups=[("square",)], prepared=True,
                            runner_fn=lambda *_: [1e-5, 2e-5])
    assert summary.measured == 1
    assert sum("JSON but not a record" in n for n in summary.repairs) == 3
    assert all(any(f"line {n}:" in r for r in summary.repairs) for n in (3, 4, 5))
    lines = [json.loads(x) for x in path.read_bytes().splitlines()]
    assert [r["members"] for r in lines] == [["0"], ["1"], ["square"]]
    (backup,) = tmp_path.glob("features.jsonl.*.bak")
    assert all(line in backup.read_bytes().splitlines() for line in NOT_RECORDS)
    assert learned.train(tmp_path, TARGET, save=False).n_records == 3


# ------------------------------------------------------------------ 3. symbolic shapes
def _dynamic_model() -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """x: (n, 4, 8) with a symbolic batch n, flattened to (n * 4, 8) (the VM computes n * 4
    in a shape function), a matmul, bias and relu."""
    rng = np.random.default_rng(0)
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([n, 4, 8], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            flat = bb.emit(relax.op.reshape(x, relax.ShapeExpr([n * 4, 8])))
            mm = bb.emit(relax.op.matmul(
                flat, relax.const(rng.standard_normal((8, 16)).astype("float32"))))
            biased = bb.emit(relax.op.add(mm, relax.const(np.ones(16, "float32"))))
            out = bb.emit_output(relax.op.nn.relu(biased))
        bb.emit_func_output(out)
    return bb.get(), {"x": rng.standard_normal((3, 4, 8)).astype("float32")}


def test_commit_refuses_a_symbolic_kernel_before_writing_anything(tmp_path):
    prepared_mod = prepare(_dynamic_model()[0])
    graph = build_graph(prepared_mod)
    calls = [n.name for n in graph.nodes if n.kind == "call_tir" and not n.view]
    func = group_kernel(prepared_mod, graph, calls[-2:])
    target = host_target()
    _, trace = schedule_kernel(func, target)
    row = {"model": "dyn", "members": calls[-2:], "error": None}
    with pytest.raises(ValueError, match=r"symbolic shapes \(n\)"):
        GroupDatabase(tmp_path).commit(func, trace, [1e-5], target, row)
    workloads = tmp_path / WORKLOAD_FILE
    assert not workloads.exists() or not workloads.read_bytes().strip()
    assert not (tmp_path / "features.jsonl").exists()


def test_tune_skips_groups_with_symbolic_shapes_and_says_so(tmp_path, caplog):
    mod = prepare(_dynamic_model()[0])
    with caplog.at_level(logging.WARNING, logger="tvm_costfuse.tuning.feedback"):
        summary = measure_model("dyn", mod, host_target(), tmp_path,
                                MeasureConfig(isolate=False), prepared=True,
                                runner_fn=lambda *_: [1e-5, 2e-5])
    assert summary.symbolic > 0 and summary.measured == summary.failed == 0
    assert f"{summary.symbolic} candidate group(s) with symbolic shapes" in caplog.text
    workloads = tmp_path / WORKLOAD_FILE
    assert not workloads.exists() or not workloads.read_bytes().strip()  # no half record
    assert not (tmp_path / "features.jsonl").exists()


def test_compare_counts_the_kernels_of_a_dynamic_model(monkeypatch):
    loaded = _dynamic_model()
    monkeypatch.setattr(models, "load", lambda spec, small=False: loaded)
    cells = compare(["dynamic"], ["none", "tvm", "costfuse"], ["llvm"], repeat=1,
                    progress=False)
    for cell in cells:
        assert cell.ok, cell.error
        assert cell.launched_kernels == cell.kernels  # the VM's shape_func is not a kernel
        assert cell.numerics == "ok" and "symbolic shapes" in cell.note


# ------------------------------------------------------------------ 4. refeature
def test_refeature_keeps_the_rows_of_a_model_that_moved(tmp_path):
    """A model file that moved (its path holding an '@', as a folder name may) keeps its rows
    as they were, said once; before, refeature died with a traceback."""
    gone = str(tmp_path / "run@2" / "net.onnx")
    rows = [{**r, "model": gone} for r in _log_rows(6)]
    path = _write_log(tmp_path, rows)
    before = path.read_bytes()
    recomputed, n_models, missing = refeature(tmp_path, "host")
    assert (recomputed, n_models, list(missing)) == (0, 0, [gone])
    assert [json.loads(line) for line in path.read_bytes().splitlines()] == [
        json.loads(line) for line in before.splitlines()]


def test_refeature_matches_rows_recorded_before_weight_folding(tmp_path):
    """Rows recorded on the unfolded graph name members folding removes (``batch_norm``):
    they are recomputed on the unfolded graph (before, ``KeyError: 'batch_norm'``); a row
    whose members neither graph has is kept as it was and named."""
    from tvm_costfuse.tuning.feedback import feature_row

    unfolded = build_graph(prepare(models.load("conv_bn_relu", small=True)[0], fold=False))
    groups = [["conv2d", "batch_norm", "bn"], ["relu"], ["no_such_member"]]
    rows = []
    for i, members in enumerate(groups):
        known = [m for m in members if m in unfolded] or ["relu"]
        row = {**feature_row("conv_bn_relu@small", unfolded, known), "members": members,
               "run_secs": [1e-5], "error": None, "workload_hash": f"{i:016x}",
               "measured": True}
        row["context"] = {k: v for k, v in row["context"].items() if k != "ends_in_reduction"}
        rows.append(row)
    path = _write_log(tmp_path, rows)
    recomputed, n_models, missing = refeature(tmp_path, "host")
    assert (recomputed, n_models) == (2, 1)
    assert list(missing) == ["conv_bn_relu@small: no_such_member"]
    after = [json.loads(line) for line in path.read_bytes().splitlines()]
    assert [r["members"] for r in after] == groups
    assert all("ends_in_reduction" in r["context"] for r in after[:2])
    assert "ends_in_reduction" not in after[2]["context"]


def test_refeature_recomputes_the_folded_rows_when_the_unfolded_graph_fails(tmp_path,
                                                                            monkeypatch):
    """A model whose unfolded graph does not build recomputes the rows its folded graph holds
    and is not reported as not loading: only the rows that needed the unfolded graph are kept,
    each named with both causes."""
    from tvm_costfuse.tuning import recorded
    from tvm_costfuse.tuning.feedback import feature_row

    folded = build_graph(prepare(models.load("conv_bn_relu", small=True)[0]))
    groups = [["relu"], ["batch_norm"], ["conv2d", "bn"]]
    rows = []
    for i, members in enumerate(groups):
        row = {**feature_row("conv_bn_relu@small", folded, [m for m in members if m in folded]
                             or ["relu"]), "members": members,
               "run_secs": [1e-5], "error": None, "workload_hash": f"{i:016x}",
               "measured": True}
        rows.append(row)
    _write_log(tmp_path, rows)

    def prepare_folded_only(mod, target=None, fold=True):
        if not fold:
            raise ValueError("unfolded import broke")
        return prepare(mod, target, fold=fold)

    monkeypatch.setattr(recorded, "prepare", prepare_folded_only)
    recomputed, n_models, missing = refeature(tmp_path, "host")
    assert (recomputed, n_models) == (2, 1)
    assert list(missing) == ["conv_bn_relu@small: batch_norm"]
    why = missing["conv_bn_relu@small: batch_norm"]
    assert "members not in its graph" in why and "unfolded graph does not build" in why
    assert "unfolded import broke" in why


def test_refeature_tries_the_unfolded_graph_when_the_folded_one_fails(tmp_path, monkeypatch):
    """A folded graph that does not build leaves the rows recorded on the unfolded graph to it;
    where neither builds, the model's rows are kept under one line naming both causes."""
    from tvm_costfuse.tuning import recorded
    from tvm_costfuse.tuning.feedback import feature_row

    unfolded = build_graph(prepare(models.load("conv_bn_relu", small=True)[0], fold=False))
    row = {**feature_row("conv_bn_relu@small", unfolded, ["relu"]), "members": ["relu"],
           "run_secs": [1e-5], "error": None, "workload_hash": f"{0:016x}", "measured": True}
    _write_log(tmp_path, [row])

    def failing(folded_fails, unfolded_fails):
        def prepare_or_fail(mod, target=None, fold=True):
            if (fold and folded_fails) or (not fold and unfolded_fails):
                raise ValueError(f"{'folded' if fold else 'unfolded'} import broke")
            return prepare(mod, target, fold=fold)
        return prepare_or_fail

    monkeypatch.setattr(recorded, "prepare", failing(True, False))
    assert refeature(tmp_path, "host")[:2] == (1, 1)
    monkeypatch.setattr(recorded, "prepare", failing(True, True))
    recomputed, n_models, missing = refeature(tmp_path, "host")
    assert (recomputed, n_models, list(missing)) == (0, 0, ["conv_bn_relu@small"])
    assert "folded import broke" in missing["conv_bn_relu@small"]
    assert "unfolded import broke" in missing["conv_bn_relu@small"]


def test_variant_names_split_only_their_own_suffix(monkeypatch):
    seen = []
    monkeypatch.setattr(models, "load", lambda name, small=False: seen.append((name, small)))
    models.load_variant("/data/run@2/net.onnx")
    models.load_variant("/data/run@2/net.onnx@small")
    assert seen == [("/data/run@2/net.onnx", False), ("/data/run@2/net.onnx", True)]
