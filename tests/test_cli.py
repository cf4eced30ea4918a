"""The ``costfuse`` command as a user meets it: each case runs the CLI of this checkout in a
process of its own. A user error is one line on stderr naming what is wrong, exit status 2,
and no traceback; nonsense is refused before any work.

The table of argument errors runs in one ``python -m`` driver that imports the package once
and forks a child per case (its own exit status and stderr); the other cases run
``python -m tvm_costfuse.cli`` each (importing TVM takes seconds per process)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def costfuse(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``costfuse ARGS`` from this checkout (the installed console script may point at
    another one)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TVM_COSTFUSE_CALIBRATION": "none"}
    return subprocess.run([sys.executable, "-m", "tvm_costfuse.cli", *args], check=False,
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


# Runs each argv of a JSON list in a forked child of one process that imported the CLI;
# prints [[exit status, stderr, stdout], ...].
_FORKING_DRIVER = """
import json, os, sys, tempfile
from tvm_costfuse.cli import main
out = []
for argv in json.loads(sys.argv[1]):
    with tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as std:
        pid = os.fork()
        if pid == 0:
            os.dup2(err.fileno(), 2)
            os.dup2(std.fileno(), 1)
            try:
                code = main(argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        err.seek(0)
        std.seek(0)
        out.append([status, err.read().decode(), std.read().decode()])
print(json.dumps(out))
"""


def costfuse_each(cases: list[list[str]]) -> list[subprocess.CompletedProcess]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TVM_COSTFUSE_CALIBRATION": "none"}
    done = subprocess.run([sys.executable, "-c", _FORKING_DRIVER, json.dumps(cases)],
                          check=True, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    return [subprocess.CompletedProcess(argv, rc, out, err)
            for argv, (rc, err, out) in zip(cases, json.loads(done.stdout.splitlines()[-1]))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert "Traceback" not in out, out
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, out
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_the_subprocess_runs_this_checkout():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = "import tvm_costfuse.cli as c; print(c.__file__)"
    where = subprocess.run([sys.executable, "-c", code],
                           cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).resolve() == ROOT / "tvm_costfuse" / "cli.py"


@pytest.fixture(scope="module")
def garbage_onnx(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("models") / "garbage.onnx"
    path.write_bytes(b"not a protobuf")
    return str(path)


@pytest.fixture(scope="module")
def a_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("files") / "plain.txt"
    path.write_text("x")
    return str(path)


USER_ERRORS = [
    (["explain", "rmsnorm", "--max-chain-length", "0"], "--max-chain-length"),
    (["explain", "rmsnorm", "--register-budget", "999"], "--register-budget"),
    (["explain", "rmsnorm", "--max-body-ops", "x"], "--max-body-ops"),
    (["compare", "--targets", "bogus"], "bogus"),
    (["compare", "--strategies", "bogus"], "bogus"),
    (["compare", "--models", "nosuch"], "nosuch"),
    (["compare", "--models", "rmsnorm,nosuch_pkg_xyz:make"], "nosuch_pkg_xyz"),
    (["compare", "--repeat", "0"], "--repeat"),
    (["explain", "rmsnorm", "--plot", "/no/such/folder/plan.png"], "/no/such/folder"),
    (["explain", "rmsnorm", "--plot", "/proc/plan.png"], "cannot write in /proc"),
    (["explain", "rmsnorm", "--plot", "/tmp/plan.notanimage"], "image format"),
    (["tune", "rmsnorm", "--budget", "-3"], "--budget"),
    (["tune", "rmsnorm", "--repeat", "0"], "--repeat"),
    (["tune", "rmsnorm", "--work-dir", "/proc/costfuse"], "cannot write in /proc"),
    (["tune", "rmsnorm", "--rpc-tracker", "no-port"], "HOST:PORT:KEY"),
    (["tune", "rmsnorm", "--target", "h100", "--rpc-tracker", "x:1:k"], "--rpc-tracker"),
    (["tune", "rmsnorm", "--labels", "bogus"], "--labels"),
    (["tune", "rmsnorm", "--budget", "some"], "--budget"),
    (["tune", "rmsnorm", "--timeout", "0"], "--timeout"),
    (["tune", "rmsnorm", "--processes", "3"], "--processes does not apply to --labels groups"),
    (["tune", "rmsnorm", "--labels", "pairs", "--target", "h100"], "--labels pairs"),
    (["tune", "rmsnorm", "--labels", "in-model", "--retrain-only"], "--retrain-only"),
    (["tune"], "no model to measure"),
    (["evaluate", "--by", "model"], "--by"),
    (["evaluate", "--seeds", "0"], "--seeds"),
    (["evaluate", "--margin", "2"], "--margin"),
    (["evaluate", "--work-dir", "/no/such/folder"], "/no/such/folder"),
    (["refeature", "--work-dir", "/proc/costfuse"], "cannot write in /proc"),
    (["restamp", "--work-dir", "/proc/costfuse"], "cannot write in /proc"),
    (["restamp", "--work-dir", "/tmp/costfuse-no-rows-here"], "no measured groups"),
    (["bench", "rmsnorm", "--plot", "/tmp/bench.notanimage"], "image format"),
    (["bench", "rmsnorm", "--strategies", "tvm", "--plot", "/tmp/bench.png"], "--plot"),
    (["demo", "--repeat", "0"], "--repeat"),
    (["demo", "--model", "missing.onnx"], "missing.onnx"),
    (["graph", "nosuch"], "nosuch"),
    (["calibrate", "--cores", "0"], "--cores"),
    (["calibrate", "--path", "/no/such/folder/cal.json"], "/no/such/folder"),
]


def test_every_argument_error_is_one_line_and_exit_2(a_file):
    cases = [*USER_ERRORS, (["compare", "--out", f"{a_file}/out"], "is not a folder")]
    results = costfuse_each([args for args, _ in cases])
    for (args, needle), result in zip(cases, results):
        try:
            _one_line_error(result, needle)
        except AssertionError as err:
            raise AssertionError(f"costfuse {' '.join(args)}: {err}") from None


def test_an_argument_error_through_python_m():
    _one_line_error(costfuse("explain", "rmsnorm", "--max-chain-length", "0"),
                    "--max-chain-length")


def test_unreachable_rpc_tracker_is_refused_before_measuring(tmp_path):
    port = _free_port()
    result = costfuse("tune", "rmsnorm", "--small", "--work-dir", str(tmp_path),
                      "--rpc-tracker", f"127.0.0.1:{port}:key")
    _one_line_error(result, "unreachable")
    assert not (tmp_path / "features.jsonl").exists()


def test_a_model_file_that_does_not_load_is_one_line(garbage_onnx):
    _one_line_error(costfuse("graph", garbage_onnx), "cannot load model", "garbage.onnx")


def test_compare_where_every_cell_failed_exits_1(garbage_onnx, tmp_path):
    result = costfuse("compare", "--models", garbage_onnx, "--strategies", "tvm", "--out",
                      str(tmp_path), "--no-progress")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "FAILED: load" in result.stdout
    assert (tmp_path / "compare.csv").exists()  # the tables still say what failed
