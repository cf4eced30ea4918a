"""First-use host calibration is never fatal and never destroys the user's data.

A probe found three ways it went wrong: a record file that could not be written (read-only
home, a folder, an empty TVM_COSTFUSE_CALIBRATION) raised out of every plan; a record with a
zero, negative or non-finite figure priced plans with it (a division by zero, negative
times); and a file TVM_COSTFUSE_CALIBRATION named that was the user's own was replaced by
calibration records. The measurement itself is faked: these tests are about the record file.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import QuietLoad

from tvm_costfuse import targets
from tvm_costfuse.measurement import calibrate
from tvm_costfuse.targets import calibration, machine

CORES = 2
MEASURED = {"dram_bw": 12.5e9, "fp32_flops": 3e11, "launch_s": 4e-6, "launch_s_serial": 1e-7,
            "l2_bw": 9e10, "l3_bw": 4e10}


def _record(**figures) -> dict:
    return {"cpu": targets.host_cpu(), "cpu_model": targets.host_cpu_model(),
            "num_cores": CORES, "quick": True, "figures": MEASURED | figures}


@pytest.fixture
def first_use(monkeypatch):
    """Point first-use calibration at a path; returns the list of measurements taken."""
    measured = []

    def fake_measure(num_cores, quick):
        measured.append(num_cores)
        return _record()

    monkeypatch.setattr(calibrate, "measure", fake_measure)
    monkeypatch.setattr(calibrate, "OtherLoad", QuietLoad)
    # Notices are given once per process: each test starts a fresh one.
    for module, name in ((calibration, "_noticed"), (machine, "_noticed"), (machine, "_failed")):
        monkeypatch.setattr(module, name, set(), raising=False)
    monkeypatch.setattr(calibration, "_measured", {})

    def point_at(path) -> list:
        monkeypatch.setattr(calibration, "CALIBRATION_PATH", path)
        return measured

    return point_at


def _notices(caplog, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and needle in r.getMessage()]


@pytest.mark.parametrize("where", ["under_a_file", "folder", "empty_env"])
def test_unwritable_record_is_one_notice_not_an_error(where, tmp_path, first_use, caplog):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "folder").mkdir()
    path = {
        "under_a_file": tmp_path / "afile" / "sub" / "host_calibration.json",  # home unwritable
        "folder": tmp_path / "folder",
        # What TVM_COSTFUSE_CALIBRATION="" becomes in targets.calibration: Path("") == ".".
        "empty_env": Path("").expanduser(),
    }[where]
    measured = first_use(path)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    with caplog.at_level(logging.WARNING):
        one = targets.host(num_cores=CORES)
        two = targets.host(num_cores=CORES)
    # The measured figures price this process' plans, measured once, without saving.
    assert one == two and one.source.endswith("+calibrated") and one.dram_bw == 12.5e9
    assert measured == [CORES]
    assert len(_notices(caplog, "not saved")) == 1, caplog.text
    # An explicit calibrate() to such a path returns the measured host as well.
    desc = calibrate.calibrate(num_cores=CORES, quick=True, path=path)
    assert desc.dram_bw == 12.5e9 and desc.source.endswith("+calibrated")
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no file, no stray .tmp
    assert (tmp_path / "afile").read_text() == "x"


@pytest.mark.parametrize("field, value", [
    ("dram_bw", 0), ("dram_bw", -1e9), ("fp32_flops", float("nan")), ("l2_bw", float("inf")),
    ("launch_s", -1e-6), ("launch_s_serial", "fast"), ("fp32_flops", True), ("dram_bw", None),
    ("math_s", -1e-10), ("math_s", 0.0), ("depthwise_s2", 0.0), ("channels_last_s1", float("nan")),
    ("gather_s", -1e-9), ("transpose_s", 0.0),
])
def test_invalid_figure_is_ignored_with_a_notice(field, value, tmp_path, first_use, caplog):
    defaults = targets.host(num_cores=CORES, calibration=False)
    path = tmp_path / "host_calibration.json"
    path.write_text(json.dumps({"records": {"k": _record(**{field: value})}}))
    with caplog.at_level(logging.WARNING):
        named = targets.host(num_cores=CORES, calibration=path)
        measured = first_use(path)
        on_first_use = targets.host(num_cores=CORES)
    assert named == defaults and on_first_use == defaults
    assert named.source.endswith("+default") and named.dram_bw > 0
    assert measured == []  # the record was read, found invalid, and not re-measured
    (notice,) = _notices(caplog, "ignored")
    assert f"{field} = {value!r}" in notice
    # Valid figures still apply, a launch cost of 0 included (calibrate's floor under noise).
    path.write_text(json.dumps({"records": {"k": _record(launch_s_serial=0.0)}}))
    good = targets.host(num_cores=CORES, calibration=path)
    assert good.source.endswith("+calibrated") and good.dram_bw == 12.5e9
    assert good.launch_s_serial == 0.0


@pytest.mark.parametrize("content", [
    '{"name": "my project", "version": 3}\n',
    "some notes of mine\n",
    "[1, 2, 3]\n",
    '{"records": [1, 2]}\n',
    "",
])
def test_a_file_that_is_not_a_record_is_never_overwritten(content, tmp_path, first_use, caplog):
    user = tmp_path / "mine.json"
    user.write_text(content)
    before = user.read_bytes()
    first_use(user)
    with caplog.at_level(logging.WARNING):
        desc = targets.host(num_cores=CORES)
        assert user.read_bytes() == before
        assert calibrate.save(_record(), user) is None
        with pytest.raises(SystemExit) as exit_:
            calibrate.main(["--quick", "--cores", str(CORES), "--path", str(user)])
    assert exit_.value.code == 1
    assert user.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.json"]
    assert _notices(caplog, str(user)), caplog.text
    # Measured figures price this process, or the defaults where even reading it failed.
    assert desc.source.endswith(("+calibrated", "+default")) and desc.dram_bw > 0
    # A record file of ours is still updated in place.
    ours = tmp_path / "ours.json"
    assert calibrate.save(_record(), ours) == ours
    assert calibrate.save(_record() | {"num_cores": CORES + 1}, ours) == ours
    assert len(json.loads(ours.read_text())["records"]) == 2


@pytest.mark.parametrize("env", [{"TVM_COSTFUSE_CALIBRATION": ""}, {"HOME": "afile"}])
def test_unwritable_record_from_the_environment(env, tmp_path):
    """The path comes from the environment when the package is imported: a fresh process with
    an empty TVM_COSTFUSE_CALIBRATION, or a HOME where ~/.cache cannot be made, still plans."""
    (tmp_path / "afile").write_text("x")
    environ = {k: v for k, v in os.environ.items() if k != "TVM_COSTFUSE_CALIBRATION"}
    environ |= {k: str(tmp_path / v) if k == "HOME" else v for k, v in env.items()}
    # The C++ shim's build cache is another matter (shim.py): keep it where it is built.
    environ.setdefault("TVM_COSTFUSE_CACHE_DIR", str(Path("~/.cache/tvm_costfuse").expanduser()))
    script = f"""
import tvm_costfuse
from tvm_costfuse import targets
from tvm_costfuse.targets import calibration
calibration.measure_on_first_use(lambda n: ({_record()!r}, 0.0))
desc = targets.host(num_cores={CORES})
assert desc.source.endswith("+calibrated") and desc.dram_bw == 12.5e9, desc
print("planned")
"""
    result = subprocess.run([sys.executable, "-c", script], check=False, cwd=tmp_path,
                            env=environ, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "planned" in result.stdout, result.stderr
    assert result.stderr.count("not saved") == 1, result.stderr
    assert (tmp_path / "afile").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
