"""Measuring candidate groups into a GroupDatabase: records load in TVM's JSONDatabase, a
second run measures nothing, and build failures become failed records."""

from __future__ import annotations

import re
import time

import pytest
import tvm
from conftest import prepared
from tvm.s_tir import meta_schedule as ms

from tvm_costfuse.cost.features import FEATURE_NAMES
from tvm_costfuse.graph import build_graph
from tvm_costfuse.targets import for_target, host_target
from tvm_costfuse.tuning import feedback, runners
from tvm_costfuse.records.database import FAILED_RUN_SECS, GroupDatabase
from tvm_costfuse.tuning.feedback import (
    MeasureConfig,
    candidate_groups,
    measure_model,
)
from tvm_costfuse.tuning.runners import build_and_time, check_rpc_tracker
from tvm_costfuse.tuning.versions import (
    KERNEL_SOURCES,
    digest,
    harness_version,
    kernel_hash,
    kernel_version,
)

GROUPS = [("matmul",), ("add",), ("matmul", "add")]
FAST = MeasureConfig(repeat=2, min_repeat_ms=5, timeout_s=120)


def _measure(work_dir, model="mlp_gelu", config=FAST, **kw):
    mod, _ = prepared("mlp_gelu")
    return measure_model(model, mod, host_target(), work_dir, config, groups=GROUPS,
                         prepared=True, **kw)


def test_candidates_are_parts_and_unions_of_decisions():
    mod, _ = prepared("mlp_gelu")
    graph = build_graph(mod)
    cands = candidate_groups(graph, for_target(host_target()))
    assert ("matmul",) in cands and ("add",) in cands and ("matmul", "add") in cands
    assert len(cands) == len(set(cands))


def test_measure_writes_records_jsondatabase_loads_and_rerun_is_resumable(tmp_path):
    s = _measure(tmp_path)
    assert (s.measured, s.failed) == (3, 0), s.errors
    db = ms.database.JSONDatabase(work_dir=str(tmp_path))
    records = db.get_all_tuning_records()
    assert len(records) == 3
    assert all(0 < float(t) < 1 for r in records for t in r.run_secs)
    rows = GroupDatabase(tmp_path).rows()
    assert [tuple(r["members"]) for r in rows] == GROUPS
    assert rows[0]["feature_names"] == list(FEATURE_NAMES)
    # The stored trace replays on the stored workload (MetaScheduleApplyDatabase can use it).
    sch = tvm.s_tir.Schedule(records[2].workload.mod)
    records[2].trace.apply_to_schedule(sch, remove_postproc=False)

    again = _measure(tmp_path)
    assert (again.measured, again.skipped) == (0, 3)
    other = _measure(tmp_path, model="mlp_gelu_copy")  # same kernels, another model's name
    assert (other.measured, other.reused) == (0, 3)
    assert len(ms.database.JSONDatabase(work_dir=str(tmp_path)).get_all_tuning_records()) == 3


def test_kernel_version_follows_the_code_and_tvm(tmp_path):
    assert any(p.parent.name == "schedules" and p.name == "gemm.py" for p in KERNEL_SOURCES)
    names = {p.name for p in KERNEL_SOURCES}
    assert {"feedback.py", "runners.py", "partition.py", "fusor.py", "pipelines.py",
            "timing.py"} <= names
    assert all(p.exists() for p in KERNEL_SOURCES)
    rule = tmp_path / "rule.py"
    rule.write_text("TILE = 8\n")
    before = digest([rule], "0.27.0")
    assert digest([rule], "0.27.0") == before
    assert digest([rule], "0.28.0") != before
    rule.write_text("TILE = 16\n")
    assert digest([rule], "0.27.0") != before


def test_rows_timed_on_other_kernels_are_measured_again(tmp_path, monkeypatch):
    first = _measure(tmp_path)
    assert first.measured == 3, first.errors
    assert {r["kernels"] for r in GroupDatabase(tmp_path).rows()} == {kernel_version()}
    # The schedule code changed since (another digest): neither the group's row nor, for
    # another model, the workload's row is a label for the kernels built now.
    monkeypatch.setattr(feedback, "kernel_version", lambda: "another-kernel")
    again = _measure(tmp_path)
    assert (again.measured, again.skipped, again.stale) == (3, 0, 3), again.errors
    rows = GroupDatabase(tmp_path).rows()
    assert len(rows) == 3 and {r["kernels"] for r in rows} == {"another-kernel"}
    assert _measure(tmp_path).skipped == 3
    monkeypatch.setattr(feedback, "kernel_version", lambda: "a-third-kernel")
    other = _measure(tmp_path, model="mlp_gelu_copy")
    assert (other.measured, other.reused) == (3, 0)


def test_builder_failure_becomes_failed_record(tmp_path, monkeypatch):
    def broken_compile(*_args, **_kw):
        raise RuntimeError("forced builder failure")

    monkeypatch.setattr(tvm, "compile", broken_compile)
    s = _measure(tmp_path, config=MeasureConfig(isolate=False), runner_fn=build_and_time)
    assert (s.measured, s.failed) == (0, 3)
    rows = GroupDatabase(tmp_path).rows()
    assert all(r["run_secs"] == [FAILED_RUN_SECS] for r in rows)
    assert rows[0]["error"].startswith("build: RuntimeError: forced builder failure")
    records = ms.database.JSONDatabase(work_dir=str(tmp_path)).get_all_tuning_records()
    assert [float(t) for t in records[0].run_secs] == [FAILED_RUN_SECS]


def test_runner_error_and_unformable_group_do_not_crash(tmp_path):
    def crash(*_args):
        raise ValueError("device lost")

    mod, _ = prepared("mlp_gelu")
    s = measure_model("m", mod, host_target(), tmp_path, MeasureConfig(isolate=False),
                      groups=[("matmul",), ("matmul", "gelu")], prepared=True, runner_fn=crash)
    assert (s.failed, s.unformable) == (1, 1)
    assert "device lost" in GroupDatabase(tmp_path).rows()[0]["error"]


def test_a_lone_reshape_is_not_timed(tmp_path):
    def must_not_run(*_args):
        raise AssertionError("a view was sent to the runner")

    mod, _ = prepared("bert_layer")
    view = next(n.name for n in build_graph(mod).nodes if n.kind == "call_tir" and n.view)
    s = measure_model("m", mod, host_target(), tmp_path, MeasureConfig(isolate=False),
                      groups=[(view,)], prepared=True, runner_fn=must_not_run)
    assert (s.views, s.measured, s.failed) == (1, 0, 0)
    assert GroupDatabase(tmp_path).rows() == []


def test_group_kernel_is_one_primfunc():
    mod, _ = prepared("mlp_gelu")
    graph = build_graph(mod)
    func = feedback.group_kernel(mod, graph, ("matmul", "add", "gelu"))
    assert isinstance(func, tvm.tirx.PrimFunc)
    assert len(ms.arg_info.ArgInfo.from_prim_func(func)) == 4


def test_group_kernel_packs_constant_weights_as_a_model_build_does():
    # The feedback loop must time the kernel a model runs: there, our CPU rules read constant
    # contraction weights tile-major (schedules/prepack.py); the measured kernel takes the
    # packed weight as a (randomly filled) input of the packed shape, and still builds and runs.
    mod, _ = prepared("mlp_gelu")
    graph = build_graph(mod)
    func = feedback.group_kernel(mod, graph, ("matmul", "add", "gelu"))
    assert list(func.attrs["layout_free_buffers"]) == [1, 2]  # the weight and the bias
    target = host_target()
    scheduled, _ = feedback.schedule_kernel(func, target)
    shapes = [tuple(int(d) for d in i.shape)
              for i in ms.arg_info.ArgInfo.from_prim_func(scheduled)]
    weight = tuple(int(d) for d in func.params[1].shape)
    assert weight not in shapes and len(shapes[1]) == 3
    assert shapes[1][1] == weight[0] and shapes[1][0] * shapes[1][2] == weight[1]
    secs = build_and_time(tvm.ir.save_json(scheduled), target.export(), 1, 2, 5, 1)
    assert len(secs) == 2 and all(s > 0 for s in secs)


def test_timed_kernel_is_finished_as_a_model_build_finishes_it():
    # A model's build turns erf into vectorizable code after the rules (fast_math): the timed
    # kernel must have gone through the same passes, or it times scalar libm calls.
    mod, _ = prepared("mlp_gelu")
    graph = build_graph(mod)
    func = feedback.group_kernel(mod, graph, ("matmul", "add", "gelu"))
    assert "T.erf(" in func.script()
    scheduled, trace = feedback.schedule_kernel(func, host_target())
    assert "T.erf(" not in scheduled.script()
    assert "vectorized" in scheduled.script()
    assert len(trace.insts) > 0  # the rules' schedule, which a database record replays


def test_kernel_is_timed_on_the_targets_cores(monkeypatch):
    from tvm_costfuse.tuning import runners

    mod, _ = prepared("mlp_gelu")
    graph = build_graph(mod)
    func = feedback.group_kernel(mod, graph, ("add", "gelu"))
    num_threads = tvm.get_global_func("runtime.NumThreads")
    pool = tvm.get_global_func("runtime.config_threadpool")
    before = num_threads()
    cores = 1 if before != 1 else 2
    target = host_target(cores)
    scheduled, _ = feedback.schedule_kernel(func, target)
    seen = []
    timed = runners._time_on

    def spy(*args, **kwargs):
        seen.append(num_threads())
        return timed(*args, **kwargs)

    monkeypatch.setattr(runners, "_time_on", spy)
    try:
        secs = runners.build_and_time(tvm.ir.save_json(scheduled), target.export(), 1, 1, 1, 1)
        assert seen == [cores] and len(secs) == 1
        assert num_threads() == before  # the caller's pool is left as it was
    finally:
        pool(1, before)


def test_multi_output_kernel_is_timed_through_the_vm():
    # gpt2's split hands three tensors on: the VM program must return all three, and a short
    # kernel is timed per call of a chain (the chain's entry cost spread over its calls).
    mod, _ = prepared("gpt2_block")
    graph = build_graph(mod)
    func, n_out = feedback.group_kernel_and_outputs(mod, graph, ("split",))
    assert n_out == 3
    _, n_fused = feedback.group_kernel_and_outputs(mod, graph, ("matmul", "add"))
    assert n_fused == 1
    target = host_target()
    scheduled, _ = feedback.schedule_kernel(func, target)
    secs = build_and_time(tvm.ir.save_json(scheduled), target.export(), 1, 2, 5, n_out)
    assert len(secs) == 2 and all(0 < s < 1e-3 for s in secs)


def test_tune_command_measures_retrains_and_replans(tmp_path, capsys):
    from tvm_costfuse.cli import main

    args = ["tune", "rmsnorm", "--small", "--budget", "3", "--repeat", "2",
            "--work-dir", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    counts = re.search(r"measured (\d+), failed (\d+), reused (\d+)", out)
    assert counts and sum(map(int, counts.groups())) == 3, out
    assert "kernels (analytical) ->" in out
    assert (tmp_path / "features.jsonl").exists()
    # Resumable: a second session re-measures nothing.
    assert main(args) == 0
    assert "measured 0, failed 0, reused 0, already recorded 3" in capsys.readouterr().out


def test_tune_times_the_other_labels_one_file_each(tmp_path, capsys):
    from tvm_costfuse.cli import main

    common = ["rmsnorm", "--small", "--budget", "1", "--repeat", "2", "--work-dir", str(tmp_path)]
    assert main(["tune", *common, "--labels", "pairs"]) == 0
    out = capsys.readouterr().out
    assert "rmsnorm@small: 1 decisions timed side by side, 0 failed" in out, out
    assert main(["tune", *common, "--labels", "in-model"]) == 0
    out = capsys.readouterr().out
    assert "rmsnorm@small: 1 decisions timed in the model" in out, out
    for name in ("pairs.jsonl", "in_model.jsonl"):
        assert len((tmp_path / name).read_text().splitlines()) == 1
    assert not (tmp_path / "features.jsonl").exists()  # no groups measured, none retrained on
    assert main(["tune", "--retrain-only", "--work-dir", str(tmp_path)]) == 2


def test_rpc_tracker_runner_measures_on_a_localhost_server(tmp_path):
    # A TVM RPC tracker and one server registered under a key, both on loopback: measurement
    # builds here and runs there, as it would on another machine of the target kind.
    from tvm import rpc
    from tvm.rpc.tracker import Tracker

    tracker = Tracker(host="127.0.0.1", port=9290, port_end=9390, silent=True)
    server = rpc.Server(host="127.0.0.1", port=9400, port_end=9500, key="costfuse-test",
                        tracker_addr=("127.0.0.1", tracker.port), silent=True)
    try:
        # The server registers with the tracker in the background: wait for it (a loaded
        # host, the whole suite on every core, took longer than the first check).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                check_rpc_tracker(f"127.0.0.1:{tracker.port}:costfuse-test")
                break
            except ValueError:
                time.sleep(0.2)
        mod, _ = prepared("rmsnorm")
        config = MeasureConfig(repeat=2, min_repeat_ms=5, timeout_s=120,
                               rpc_tracker=f"127.0.0.1:{tracker.port}:costfuse-test")
        graph = build_graph(mod)
        group = tuple(graph.call_tir_names()[:2])
        summary = measure_model("rmsnorm@rpc", mod, host_target(), tmp_path, config,
                                groups=[group], prepared=True)
        assert summary.measured == 1 and summary.failed == 0, summary.errors
        (row,) = GroupDatabase(tmp_path).rows()
        assert 0 < min(row["run_secs"]) < FAILED_RUN_SECS
        # No server under this key: refused before measuring (it would fail every candidate).
        bad = MeasureConfig(repeat=2, min_repeat_ms=5, timeout_s=15,
                            rpc_tracker=f"127.0.0.1:{tracker.port}:no-such-key")
        with pytest.raises(ValueError, match="no server under key 'no-such-key'"):
            measure_model("rmsnorm@rpc-bad", mod, host_target(), tmp_path / "bad", bad,
                          groups=[group], prepared=True)
        assert not (tmp_path / "bad" / "features.jsonl").exists()
    finally:
        server.terminate()
        tracker.terminate()


def test_cuda_candidates_get_ptxas_resources_and_are_timed_only_on_a_gpu(tmp_path):
    """On a CUDA target every candidate is compiled with dlight's rules and profiled by ptxas
    (nvcc, no GPU needed); without a GPU it is recorded untimed, and not trained on."""
    from tvm_costfuse import models
    from tvm_costfuse.cost import learned
    from tvm_costfuse.pipelines import prepare
    from tvm_costfuse.targets import preset

    desc = preset("h200")
    target = desc.tvm_target()
    mod = prepare(models.load("mlp_gelu", small=True)[0], target)
    s = measure_model("mlp_gelu@small", mod, target, tmp_path, FAST, groups=GROUPS,
                      prepared=True)
    gpu = bool(tvm.cuda().exist)
    assert s.failed == 0, s.errors
    assert (s.measured, s.untimed) == ((3, 0) if gpu else (0, 3))
    rows = GroupDatabase(tmp_path).rows()
    assert [tuple(r["members"]) for r in rows] == GROUPS
    for row in rows:
        assert row["ptxas"]["registers"] > 0 and row["ptxas"]["kernels"] >= 1
        assert row["ptxas"]["spill_bytes"] >= 0
        if not gpu:
            assert row["run_secs"] == [] and row["not_timed"] == "no GPU present"
    records = ms.database.JSONDatabase(work_dir=str(tmp_path)).get_all_tuning_records()
    assert len(records) == 3
    assert all((r.run_secs is not None) == gpu for r in records)
    assert learned.rows_to_dataset(rows, desc)[1].size == (3 if gpu else 0)


def test_untimed_cuda_groups_are_timed_once_a_gpu_is_there(tmp_path, monkeypatch):
    """Recorded without a GPU, a group is not "already recorded" on a GPU: it is measured then,
    and its workload is reused from the timed row (the GPU here is simulated: a runner that
    returns times, as build_and_profile_cuda does on a GPU)."""
    from tvm_costfuse import models
    from tvm_costfuse.pipelines import prepare
    from tvm_costfuse.targets import preset

    desc = preset("h200")
    target = desc.tvm_target()
    mod = prepare(models.load("mlp_gelu", small=True)[0], target)
    untimed = {"run_secs": [], "ptxas": {"registers": 8, "spill_bytes": 0, "kernels": 1},
               "not_timed": "no GPU present"}
    timed = {"run_secs": [2e-6, 3e-6], "ptxas": {"registers": 8, "spill_bytes": 0,
                                                   "kernels": 1}}

    def measure(model, result):
        return measure_model(model, mod, desc, tmp_path, MeasureConfig(isolate=False),
                             groups=GROUPS, prepared=True,
                             runner_fn=lambda *_a, **_k: result)

    monkeypatch.setattr(runners, "_gpu_present", lambda: False)
    first = measure("m", untimed)
    assert (first.untimed, first.measured) == (3, 0)
    again = measure("m", untimed)
    assert again.skipped == 3  # still no GPU: nothing to redo
    monkeypatch.setattr(runners, "_gpu_present", lambda: True)
    on_gpu = measure("m", timed)
    assert (on_gpu.measured, on_gpu.skipped) == (3, 0)
    other = measure("m2", untimed)
    assert other.reused == 3
    rows = [r for r in GroupDatabase(tmp_path).rows() if r["model"] == "m2"]
    assert all(r["run_secs"] == [2e-6, 3e-6] and r["ptxas"]["registers"] == 8 for r in rows)


def test_cuda_kernel_without_nvcc_is_still_recorded_with_the_reason(monkeypatch):
    from tvm_costfuse import models
    from tvm_costfuse.measurement import registers
    from tvm_costfuse.pipelines import prepare
    from tvm_costfuse.targets import preset

    def no_nvcc(*_a, **_k):
        raise FileNotFoundError("nvcc not found")

    monkeypatch.setattr(registers, "ptxas_report", no_nvcc)
    target = preset("h200").tvm_target()
    mod = prepare(models.load("mlp_gelu", small=True)[0], target)
    func, n_out = feedback.group_kernel_and_outputs(mod, build_graph(mod), ("add",))
    scheduled, _ = feedback.schedule_kernel(func, target)
    out = feedback.build_and_profile_cuda(tvm.ir.save_json(scheduled), target.export(), 1, 2,
                                          5, n_out)
    assert out["ptxas"] is None and "nvcc not found" in out["ptxas_error"]
    if not tvm.cuda().exist:
        assert out["run_secs"] == [] and out["not_timed"] == "no GPU present"
    else:
        assert out["run_secs"] and all(0 < t < 1 for t in out["run_secs"])


def test_a_kernels_hash_is_what_it_compiles_to():
    """``versions.kernel_hash``: the same scheduled kernel hashes alike each time, and alike
    under another model's binding names (one workload: mlp_gelu's ``matmul``, bert_layer's
    ``matmul6``); the same group left unscheduled (another kernel), or with another count of
    outputs, does not."""
    from tvm_costfuse.records.database import workload_hash

    target = host_target()

    def kernel(name, members):
        mod, _ = prepared(name)
        func, n_out = feedback.group_kernel_and_outputs(mod, build_graph(mod), members)
        return func, feedback.schedule_kernel(func, target)[0], n_out

    func, scheduled, n_out = kernel("mlp_gelu", ["matmul", "add"])
    again = feedback.schedule_kernel(func, target)[0]
    assert kernel_hash(scheduled, target, n_out) == kernel_hash(again, target, n_out)
    plain = feedback.backend(target).finish(func)
    assert kernel_hash(plain, target, n_out) != kernel_hash(scheduled, target, n_out)
    assert kernel_hash(scheduled, target, n_out + 1) != kernel_hash(scheduled, target, n_out)
    mine, theirs = kernel("mlp_gelu", ["matmul"]), kernel("bert_layer", ["matmul6"])
    assert workload_hash(mine[0]) == workload_hash(theirs[0])
    assert kernel_hash(mine[1], target, mine[2]) == kernel_hash(theirs[1], target, theirs[2])


# the name the rows of ``_measure``'s small shapes go under, as ``restamp`` rebuilds them
SMALL = "mlp_gelu@small"


def test_restamp_keeps_the_rows_whose_kernel_an_edit_left_alone(tmp_path, monkeypatch):
    """After an edit of the kernel code (another digest), ``restamp`` restamps a row whose
    kernel and harness are unchanged and leaves stale the one whose kernel changed and the ones
    it cannot vouch for; ``tune`` then measures exactly those."""
    from tvm_costfuse.tuning import restamp as restamp_module

    first = _measure(tmp_path, model=SMALL)
    assert first.measured == 3, first.errors
    db = GroupDatabase(tmp_path)
    rows = db.rows()
    assert all(len(r["kernel_hash"]) == 16 and r["harness"] == harness_version() for r in rows)
    before = rows[0]["kernels"]
    changed = {**rows[1], "kernel_hash": "0" * 16}  # timed a kernel the code builds no more
    old_harness = {**rows[2], "harness": "another-harness"}
    with db.writing():
        db.rewrite_rows([rows[0], changed, old_harness])
    monkeypatch.setattr(restamp_module, "kernel_version", lambda: "after-the-edit")
    summary = restamp_module.restamp(tmp_path, "host")
    assert (summary.restamped, summary.changed, summary.unverifiable) == (1, 1, 1)
    assert not summary.missing
    assert [r["kernels"] for r in GroupDatabase(tmp_path).rows()] == [
        "after-the-edit", before, before]
    monkeypatch.setattr(feedback, "kernel_version", lambda: "after-the-edit")
    again = _measure(tmp_path, model=SMALL)
    assert (again.measured, again.skipped, again.stale) == (2, 1, 2), again.errors


def test_restamp_hashes_current_rows_recorded_without_a_hash(tmp_path):
    """Rows stamped with today's digest but recorded before rows had a hash get the hash of
    the kernel the current code builds (the one they timed); a row whose model no longer
    loads keeps its row and is named."""
    from tvm_costfuse.tuning.restamp import restamp

    assert _measure(tmp_path, model=SMALL).measured == 3
    db = GroupDatabase(tmp_path)
    rows = db.rows()
    hashes = [r["kernel_hash"] for r in rows]
    bare = [{k: v for k, v in r.items() if k not in ("kernel_hash", "harness")} for r in rows]
    lost = {**bare[0], "model": "no_such_model_anymore"}
    # hashed by an older procedure (its harness, with versions.py, differs): hashed anew
    bare[2] = {**rows[2], "kernel_hash": "0" * 16, "harness": "an-older-hash"}
    with db.writing():
        db.rewrite_rows([*bare, lost])
    summary = restamp(tmp_path, "host")
    assert (summary.current, summary.hashed) == (4, 3)
    assert list(summary.missing) == ["no_such_model_anymore"]
    after = GroupDatabase(tmp_path).rows()
    assert [r.get("kernel_hash") for r in after] == [*hashes, None]
    assert {r["harness"] for r in after[:3]} == {harness_version()}
