"""A tuning folder stays whole: one writer at a time, kills and torn writes repaired on open,
environmental failures measured again, unreadable model files named. Every case ends with the
same three checks: no complete record lost, TVM's JSONDatabase loads the folder, one row per
(model, group).

Sessions that are killed or run side by side are real processes (``python -c`` on
:data:`_SESSION`), measuring rmsnorm's candidates with a stand-in runner that sleeps instead of
compiling (the database, not the timing, is under test).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import prepared
from tvm.s_tir import meta_schedule as ms

from tvm_costfuse.cost import learned
from tvm_costfuse.graph import build_graph
from tvm_costfuse.targets import for_target, host_target
from tvm_costfuse.records.database import GroupDatabase, failure_kind
from tvm_costfuse.tuning.feedback import MeasureConfig, candidate_groups, measure_model
from tvm_costfuse.records.integrity import DatabaseLocked, exclusive

ROOT = Path(__file__).resolve().parent.parent
MODEL = "rmsnorm"
INLINE = MeasureConfig(isolate=False)

# argv: work_dir, seconds per candidate, "wait" or "nowait". Exit 3 when the folder is locked.
_SESSION = """
import sys, time
from tvm_costfuse import models
from tvm_costfuse.pipelines import prepare
from tvm_costfuse.targets import host_target
from tvm_costfuse.tuning.feedback import MeasureConfig, measure_model
from tvm_costfuse.records.integrity import DatabaseLocked
work_dir, pause, wait = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "wait"
def runner(*_args):
    time.sleep(pause)
    return [1e-5, 2e-5]
mod = prepare(models.load("rmsnorm", small=True)[0])
try:
    s = measure_model("rmsnorm", mod, host_target(), work_dir, MeasureConfig(isolate=False),
                      prepared=True, runner_fn=runner, wait=wait)
except DatabaseLocked as err:
    print(err, file=sys.stderr)
    sys.exit(3)
print("summary", s.measured, s.skipped, flush=True)
"""


def _start(work_dir, pause=0.3, wait=False) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TVM_COSTFUSE_CALIBRATION": "none"}
    return subprocess.Popen([sys.executable, "-c", _SESSION, str(work_dir), str(pause),
                             "wait" if wait else "nowait"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _wait_for_lines(path: Path, n: int, proc: subprocess.Popen, timeout=240.0) -> None:
    end = time.monotonic() + timeout
    while _lines(path) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "the session wrote nothing"
        time.sleep(0.05)


def _candidates() -> list[tuple[str, ...]]:
    mod, _ = prepared(MODEL)
    return candidate_groups(build_graph(mod), for_target(host_target()))


def _assert_whole(work_dir: Path, groups=None) -> list[dict]:
    """TVM loads the folder, one row per group (all of ``groups`` when given), every measured
    row's workload has a TVM record."""
    rows = GroupDatabase(work_dir).rows()
    keys = collections.Counter((r["model"], tuple(r["members"])) for r in rows)
    assert all(n == 1 for n in keys.values()), keys
    # The file itself: no duplicate lines either.
    on_disk = [json.loads(x) for x in (work_dir / "features.jsonl").read_text().splitlines()]
    assert len(on_disk) == len(rows)
    if groups is not None:
        assert {k[1] for k in keys} == set(groups)
    records = ms.database.JSONDatabase(work_dir=str(work_dir)).get_all_tuning_records()
    assert len(records) >= sum(r["measured"] for r in rows)
    return rows


def _measure(work_dir, runner, groups=None, model=MODEL):
    mod, _ = prepared(MODEL)
    return measure_model(model, mod, host_target(), work_dir, INLINE, groups=groups,
                         prepared=True, runner_fn=runner)


def _fast(*_args):
    return [1e-5, 2e-5]


# ------------------------------------------------------------------------------ one writer
def test_two_sessions_on_one_folder_one_writes_the_other_refuses_or_waits(tmp_path):
    first = _start(tmp_path, pause=2.0)  # 11 candidates: ~20 s, while the others start
    _wait_for_lines(tmp_path / "features.jsonl", 1, first)
    refused = _start(tmp_path, wait=False)
    assert refused.wait(timeout=240) == 3
    assert "is being written by pid" in refused.stderr.read()
    waiting = _start(tmp_path, pause=0.0, wait=True)
    assert first.wait(timeout=240) == 0, first.stderr.read()
    assert waiting.wait(timeout=240) == 0, waiting.stderr.read()
    groups = _candidates()
    # The waiting session found every group recorded: nothing measured twice.
    assert waiting.stdout.read().split() == ["summary", "0", str(len(groups))]
    rows = _assert_whole(tmp_path, groups)
    assert len(rows) == len(groups)


def test_tune_on_a_locked_folder_is_one_line_and_exit_2(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TVM_COSTFUSE_CALIBRATION": "none"}
    with exclusive(tmp_path):
        result = subprocess.run([sys.executable, "-m", "tvm_costfuse.cli", "tune", MODEL,
                                 "--small", "--budget", "1", "--work-dir", str(tmp_path)],
                                cwd=ROOT, env=env, capture_output=True, text=True, check=False,
                                timeout=300)
    assert result.returncode == 2, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "is being written by pid" in lines[0], result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_a_locked_folder_raises_in_process(tmp_path):
    with exclusive(tmp_path), pytest.raises(DatabaseLocked, match="--wait"):
        _measure(tmp_path, _fast, groups=[("square",)])


# ------------------------------------------------------------------------------ kills
def test_sigkill_mid_session_loses_no_complete_record_and_resumes(tmp_path):
    proc = _start(tmp_path, pause=1.0)
    _wait_for_lines(tmp_path / "features.jsonl", 3, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    complete = [json.loads(x) for x in (tmp_path / "features.jsonl").read_bytes().splitlines()
                if x.strip()]
    with GroupDatabase(tmp_path).writing():  # the next writer repairs what the kill left
        pass
    kept = {tuple(r["members"]) for r in _assert_whole(tmp_path)}
    assert {tuple(r["members"]) for r in complete} <= kept
    resumed = _measure(tmp_path, _fast)
    groups = _candidates()
    assert resumed.skipped >= len(complete)
    _assert_whole(tmp_path, groups)


def test_torn_last_features_line_is_cut_and_the_next_append_survives(tmp_path, caplog):
    _measure(tmp_path, _fast, groups=[("square",), ("mean",), ("square", "mean")])
    path = tmp_path / "features.jsonl"
    data = path.read_bytes()
    last = data[:-1].rfind(b"\n") + 1
    path.write_bytes(data[: last + (len(data) - last) // 2])  # a kill in the third write
    db = GroupDatabase(tmp_path)
    assert len(db.repairs) == 1 and "line 3: cut short" in db.repairs[0]
    assert "tuning database repaired" in caplog.text
    assert path.read_bytes() == data[:last]
    again = _measure(tmp_path, _fast, groups=[("square",), ("mean",), ("square", "mean")])
    assert (again.skipped, again.measured) == (2, 1)
    _assert_whole(tmp_path, [("square",), ("mean",), ("square", "mean")])


def test_a_torn_line_glued_to_the_next_record_keeps_the_complete_one(tmp_path):
    # What the old appender left: a kill mid-line, then the next session's line right after.
    _measure(tmp_path, _fast, groups=[("square",), ("mean",)])
    path = tmp_path / "features.jsonl"
    first, second = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(first[:40] + second)
    db = GroupDatabase(tmp_path)
    assert [tuple(r["members"]) for r in db.rows()] == [("mean",)]
    assert any("line 1" in n and "kept the complete one" in n for n in db.repairs)
    assert list(tmp_path.glob("features.jsonl.*.bak"))


def _tvm_files(tmp_path):
    _measure(tmp_path, _fast, groups=[("square",), ("mean",), ("add",), ("rsqrt",)])
    return tmp_path / "database_workload.json", tmp_path / "database_tuning_record.json"


@pytest.mark.parametrize("damage", ["torn workload", "torn record", "garbage workload",
                                    "garbage record"])
def test_damaged_tvm_files_are_salvaged_naming_file_and_line(tmp_path, damage):
    workloads, records = _tvm_files(tmp_path)
    n_records = len(records.read_bytes().splitlines())
    path = workloads if "workload" in damage else records
    data = path.read_bytes()
    if damage.startswith("torn"):  # a kill mid-way through the last line
        path.write_bytes(data + data.splitlines(keepends=True)[0][:50])
    else:
        lines = data.splitlines(keepends=True)
        path.write_bytes(b"".join(lines[:1] + [b"[0, \"not a record\"\n"] + lines[1:]))
    with pytest.raises(Exception):  # noqa: B017 -- what TVM says is not ours to match
        ms.database.JSONDatabase(work_dir=str(tmp_path))
    db = GroupDatabase(tmp_path)
    with db.writing():
        pass
    assert any(f"{path.name} line" in n for n in db.repairs), db.repairs
    assert list(tmp_path.glob(f"{path.name}.*.bak"))
    loaded = ms.database.JSONDatabase(work_dir=str(tmp_path)).get_all_tuning_records()
    assert len(loaded) == n_records  # every valid record kept
    _assert_whole(tmp_path)


def test_a_folder_two_unlocked_sessions_wrote_is_salvaged_and_compacted(tmp_path):
    # Reproduce what two sessions without the lock left: each had its own JSONDatabase open
    # (so each numbered its new workload 0), and both appended the same groups' rows.
    _measure(tmp_path / "a", _fast, groups=[("square",), ("mean",)])
    _measure(tmp_path / "b", _fast, groups=[("add",), ("rsqrt",)])
    for name in ("database_workload.json", "database_tuning_record.json"):
        (tmp_path / name).write_bytes((tmp_path / "a" / name).read_bytes()
                                      + (tmp_path / "b" / name).read_bytes())
    rows = (tmp_path / "a" / "features.jsonl").read_bytes()
    rows += (tmp_path / "b" / "features.jsonl").read_bytes()
    (tmp_path / "features.jsonl").write_bytes(rows + rows)  # 8 rows for 4 groups
    with pytest.raises(Exception):  # noqa: B017
        ms.database.JSONDatabase(work_dir=str(tmp_path))
    db = GroupDatabase(tmp_path)
    with db.writing():
        pass
    assert sum("re-attached" in n for n in db.repairs) == 2, db.repairs
    assert any("4 superseded rows compacted" in n for n in db.repairs), db.repairs
    rows = _assert_whole(tmp_path, [("square",), ("mean",), ("add",), ("rsqrt",)])
    loaded = ms.database.JSONDatabase(work_dir=str(tmp_path)).get_all_tuning_records()
    assert len(loaded) == 4
    for record in loaded:  # each record replays on its workload
        sch = ms.database.TuningRecord.from_json(record.as_json(), record.workload)
        assert sch is not None


# ------------------------------------------------------------------------------ failures
def test_an_environmental_failure_is_kept_out_and_measured_again(tmp_path):
    def timed_out(*_args):
        raise TimeoutError

    groups = [("square",), ("mean",)]
    first = _measure(tmp_path, timed_out, groups)
    assert (first.failed, first.environment, first.measured) == (2, 2, 0)
    rows = GroupDatabase(tmp_path).rows()
    assert all(r["failure"] == "environment" and r["error"].startswith("timeout") for r in rows)
    assert not ms.database.JSONDatabase(work_dir=str(tmp_path)).get_all_tuning_records()
    again = _measure(tmp_path, _fast, groups)
    assert (again.measured, again.skipped) == (2, 0)
    rows = _assert_whole(tmp_path, groups)
    assert all(r["measured"] and not r.get("error") for r in rows)


def test_a_kernel_failure_keeps_its_full_text_and_is_not_retried(tmp_path):
    text = ("Traceback (most recent call last):\n  File \"worker.py\", line 1, in <module>\n"
            "RuntimeError: build: InternalError: Check failed: (x) is false")

    def broken(*_args):
        raise RuntimeError(text)

    first = _measure(tmp_path, broken, [("square",)])
    (row,) = GroupDatabase(tmp_path).rows()
    assert row["error"] == text and row["failure"] == "kernel"
    assert first.errors == [("('square',): RuntimeError: build: InternalError: Check failed: "
                             "(x) is false")]
    assert _measure(tmp_path, _fast, [("square",)]).skipped == 1


def test_a_worker_error_is_stored_whole(tmp_path):
    # A real worker process: its error reaches us as a traceback whose first line says nothing.
    mod, _ = prepared(MODEL)
    s = measure_model(MODEL, mod, host_target(), tmp_path, MeasureConfig(timeout_s=120),
                      groups=[("square",)], prepared=True, runner_fn=json.loads)
    (row,) = GroupDatabase(tmp_path).rows()
    assert row["error"].startswith("Traceback") and "TypeError" in row["error"]
    assert "TypeError" in s.errors[0]
    assert row["failure"] == "environment"  # not a build: or run: error of the kernel


def test_failure_kinds():
    assert failure_kind(None) is None
    assert failure_kind("build: RuntimeError: x") == "kernel"
    assert failure_kind("Traceback ...\n  File x\nRuntimeError: run: y") == "kernel"
    assert failure_kind("timeout: build + run exceeded 120 s") == "environment"
    assert failure_kind("rpc: no RPC server for key 'k'") == "environment"
    assert failure_kind("Traceback (most recent call last):") == "environment"


def test_an_unreachable_tracker_fails_before_measuring(tmp_path):
    mod, _ = prepared(MODEL)
    config = MeasureConfig(rpc_tracker="127.0.0.1:1:key")
    with pytest.raises(ValueError, match="unreachable"):
        measure_model(MODEL, mod, host_target(), tmp_path, config, groups=[("square",)],
                      prepared=True)
    assert not (tmp_path / "features.jsonl").exists()


@pytest.mark.parametrize(("field", "value"), [("repeat", 0), ("number", 0),
                                              ("min_repeat_ms", -1), ("timeout_s", 0)])
def test_measure_config_refuses_nonsense(field, value):
    with pytest.raises(ValueError, match=field):
        MeasureConfig(**{field: value})


# ------------------------------------------------------------------------------ model files
def test_a_corrupt_model_meta_names_the_file_and_retrains_from_the_log(tmp_path, caplog):
    desc = for_target(host_target())
    _measure(tmp_path, _fast, groups=[("square",), ("mean",)])
    learned.train(tmp_path, desc)
    meta = tmp_path / learned.META_FILE
    meta.write_text(meta.read_text()[:30])  # a torn write
    with pytest.raises(learned.ModelFileError, match=str(meta)) as err:
        learned.LearnedModel.load(tmp_path)
    assert "costfuse tune" in str(err.value)
    model = learned.load_learned(desc, tmp_path)  # the log is there: retrain in memory
    assert isinstance(model, learned.LearnedModel)
    assert "is unreadable" in caplog.text
    (tmp_path / "features.jsonl").unlink()
    with pytest.raises(learned.ModelFileError, match="delete the xgb_model"):
        learned.load_learned(desc, tmp_path)
