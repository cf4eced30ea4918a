"""Meta-schedule path: tune one fused kernel, apply the database, rules for the rest.

One tuning run (small mlp_gelu, only its matmul+bias+gelu kernel, 2 measured trials, built and
timed in this process) is shared by every test in this file; it takes about a minute on 2
cores, mostly meta-schedule importing TVM's tensor intrinsics.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import tvm
from tvm.s_tir import meta_schedule as ms

from tvm_costfuse import models
from tvm_costfuse.measurement.timing import assert_close, build, run
from tvm_costfuse.targets import host_target
from tvm_costfuse.records.database import default_work_dir

# One worker runs this file, so the tuning run below is made once, not once per worker.
pytestmark = pytest.mark.xdist_group("metaschedule-tuning")
from tvm_costfuse.tuning.metaschedule import fuse, target_dir, tune_model, tuned_pipeline

TUNED = "fused_matmul_add_gelu"  # FuseOps' first group in mlp_gelu: the one we tune
UNTUNED = "fused_matmul1_add1"  # the second Linear: left to our rules


@pytest.fixture(scope="module")
def target():
    return host_target()


@pytest.fixture(scope="module")
def model():
    return models.load("mlp_gelu", small=True)


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory, target, model):
    path = tmp_path_factory.mktemp("tuning")
    # The records' round trip is under test, not the search or the worker pools (their
    # start-up alone is minutes on 2 busy cores)
    tune_model(model[0], target, path, max_trials=2, op_names=["gelu"], strategy="replay-trace",
               in_process=True)
    return path


def _scheduled(target, work_dir) -> tvm.IRModule:
    """The fused module after ApplyDatabase and our rules, as tuned_pipeline schedules it."""
    mod = fuse(models.load("mlp_gelu", small=True)[0], target)
    with target:
        mod = tvm.relax.transform.MetaScheduleApplyDatabase(str(work_dir))(mod)
        from tvm_costfuse.schedules import schedule_pass

        return schedule_pass(target)(mod)


def test_fused_kernels_are_the_expected_tasks(target, model):
    names = {
        gv.name_hint
        for gv, f in fuse(model[0], target).functions.items()
        if isinstance(f, tvm.tirx.PrimFunc)
    }
    assert names == {TUNED, UNTUNED}


def test_database_files_load_in_tvm(work_dir):
    assert (work_dir / "database_workload.json").stat().st_size > 0
    assert (work_dir / "database_tuning_record.json").stat().st_size > 0
    db = ms.database.JSONDatabase(work_dir=str(work_dir))
    records = db.get_all_tuning_records()
    assert len(records) >= 1
    secs = [float(s) for r in records for s in (r.run_secs or [])]
    assert secs and all(math.isfinite(s) and s > 0 for s in secs)


def test_tuned_build_matches_unfused(target, model, work_dir):
    mod, inputs = model
    ex = tvm.compile(mod, target=target, relax_pipeline=tuned_pipeline(target, work_dir))
    assert_close(run(ex, inputs), run(build(mod, target), inputs))


def test_tuned_kernel_from_database_untuned_kernel_from_rules(target, work_dir):
    mod = _scheduled(target, work_dir)
    tuned, untuned = mod[TUNED], mod[UNTUNED]
    # Both are marked scheduled: ApplyDatabase marks the tuned one, dlight marks the other.
    assert tuned.attrs["tirx.is_scheduled"] and untuned.attrs["tirx.is_scheduled"]
    # Only meta-schedule's multi-level tiling leaves this block annotation behind.
    assert "meta_schedule.tiling_structure" in tuned.script()
    assert "meta_schedule.tiling_structure" not in untuned.script()


def test_tuning_folders_of_an_installed_package_are_the_users(monkeypatch, tmp_path):
    """Installed (no checkout around the package), tuning is written under the user's cache,
    not into site-packages; TVM_COSTFUSE_TUNING_DIR names another folder in any case."""
    from tvm_costfuse.records import database

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("TVM_COSTFUSE_TUNING_DIR", raising=False)
    monkeypatch.setattr(database, "_PACKAGE_PARENT", tmp_path / "site-packages")
    assert database.tuning_root() == tmp_path / ".cache" / "tvm_costfuse" / "tuning_logs"
    monkeypatch.setenv("TVM_COSTFUSE_TUNING_DIR", str(tmp_path / "mine"))
    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    assert default_work_dir(cuda) == tmp_path / "mine" / "cuda-sm_90" / "groups"


def test_missing_database_is_an_error(target, tmp_path):
    with pytest.raises(FileNotFoundError, match="tune_model"):
        tuned_pipeline(target, tmp_path)


def test_tuning_folders_name_the_cpu_under_the_repository(target, monkeypatch):
    """Meta-schedule tunes into tuning_logs/<kind>-<mcpu>/ at the repository root (where the
    committed databases are), candidate groups into its groups/ folder."""
    monkeypatch.delenv("TVM_COSTFUSE_TUNING_DIR", raising=False)
    root = Path(__file__).resolve().parents[1] / "tuning_logs"
    assert target_dir(target) == root / f"llvm-{target.attrs['mcpu']}"
    assert default_work_dir(target) == target_dir(target) / "groups"
    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    assert target_dir(cuda) == root / "cuda-sm_90"
