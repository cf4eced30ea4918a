"""The ``costfuse`` command where a probe broke it: a torn cached shim, no compiler, ``--version``,
help on every argument, a closed pipe, an empty target list, the ``stock`` strategy's claim,
and a wheel that ships the learned models. Each test failed before its fix."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tvm

from tvm_costfuse import cli, models, strategies
from tvm_costfuse.config import shim_path
from tvm_costfuse.cost.learned import MODEL_FILE, POINTS_FILE
from tvm_costfuse.cost.learned_files import META_FILE
from tvm_costfuse.measurement.timing import run

ROOT = Path(__file__).resolve().parent.parent


# This checkout, whatever the installed console script points at (as tests/test_cli.py).
_ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TVM_COSTFUSE_CALIBRATION": "none"}


def _cli(args: list[str], command: list[str] | None = None, **env: str):
    """``python -m tvm_costfuse.cli ARGS`` (or ``command`` + ARGS) in a fresh process."""
    command = command or [sys.executable, "-m", "tvm_costfuse.cli"]
    return subprocess.run([*command, *args], env={**_ENV, **env}, capture_output=True,
                          text=True, timeout=300, check=False)


def test_torn_cached_shim_is_rebuilt_not_loaded(tmp_path):
    # A kill while the shim was linking left half a library (and the stamp of a whole one):
    # dlopen of it died with SIGBUS, so even `costfuse --help` crashed and printed nothing.
    whole = shim_path()  # this process's cached shim, whole: the import just loaded it
    torn = shim_path(tmp_path)
    torn.parent.mkdir(parents=True)
    data = whole.read_bytes()
    torn.write_bytes(data[: len(data) // 2])
    stamp = whole.with_name(whole.name + ".sha256")
    if stamp.exists():
        shutil.copy(stamp, torn.with_name(stamp.name))
    proc = _cli(["--help"], TVM_COSTFUSE_CACHE_DIR=str(tmp_path))
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.startswith("usage: costfuse")
    assert torn.stat().st_size > len(data) // 2  # rebuilt in place


def test_no_compiler_or_unwritable_cache_is_one_line_exit_2(tmp_path):
    # Before: a 40-line traceback and status 1 from the import, before the command ran.
    script = shutil.which("costfuse")
    no_tools = _cli(["--help"], PATH=str(tmp_path / "empty-bin"),
                    TVM_COSTFUSE_CACHE_DIR=str(tmp_path / "cache"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    unwritable = _cli(["models"], [script] if script else None,
                      TVM_COSTFUSE_CACHE_DIR=str(blocker / "cache"))
    for proc, cause in ((no_tools, "ninja"), (unwritable, "Not a directory")):
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert len(lines) == 1, proc.stderr[-2000:]
        assert lines[0].startswith("costfuse: error: could not build the C++ shim"), lines
        assert cause in lines[0] and "TVM_COSTFUSE_CACHE_DIR" in lines[0]


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"costfuse {importlib.metadata.version('tvm_costfuse')}\n"


def test_every_argument_has_help_and_the_tool_says_what_it_is(capsys):
    from tvm_costfuse.cli_args import build_parser

    parsers, seen, bare = [("costfuse", build_parser())], set(), []
    while parsers:
        name, parser = parsers.pop()
        if id(parser) in seen:  # an alias (zoo) is the same parser
            continue
        seen.add(id(parser))
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                bare += [f"{name} {a.dest}" for a in action._choices_actions if not a.help]
                parsers += [(f"{name} {n}", p) for n, p in action.choices.items()]
            if not action.help or action.help == argparse.SUPPRESS:
                bare.append(f"{name} {action.option_strings or action.dest}")
    assert not bare, f"arguments without help: {bare}"
    assert len(seen) == len(cli.COMMANDS) + 1  # the root and each command
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    description = capsys.readouterr().out.split("\n\n")[1]
    assert "``" not in description and "fusion" in description and "TVM" in description


def test_closed_pipe_exits_quietly():
    # `costfuse models | head -1`: the reader is gone before the command writes.
    proc = subprocess.Popen([sys.executable, "-m", "tvm_costfuse.cli", "models"], env=_ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) in (0, 141), err
    assert "BrokenPipeError" not in err and "Traceback" not in err, err


@pytest.mark.parametrize(("value", "says"), [("", "empty list"), (",", "empty list"),
                                             ("llvm,rocm", "unknown 'rocm'")])
def test_target_list_errors_name_the_choices(value, says, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["compare", "--targets", value])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert says in err and "llvm, cuda" in err and "nothing not in" not in err, err


def test_stock_is_get_default_pipeline_which_fuses_unlike_tvm_compile_default():
    """The ``stock`` docstring's claim, checked on the installed TVM: its pipeline runs FuseOps,
    ``tvm.compile``'s own default on llvm does not."""
    mod, inputs = models.load("elementwise_chain", small=True)
    target = tvm.target.Target("llvm")

    def kernels(pipeline) -> int:
        calls: list[str] = []
        run(tvm.compile(mod, target, relax_pipeline=pipeline), inputs, calls=calls)
        return len(calls)

    assert kernels(strategies.strategy_pipeline("stock", target)) < kernels("default")
    doc = " ".join(strategies.__doc__.split())
    assert "``relax.get_default_pipeline(target)``" in doc
    assert "not what ``tvm.compile(mod, target)`` runs" in doc


def test_wheel_ships_the_learned_models_where_the_package_looks(tmp_path):
    # Before: a plain `pip install .` carried no tuning_logs/, so "xgb" planned analytically.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.lock", "*.bak", "*.tmp")
    for name in ("tvm_costfuse", "schedules", "tuning_logs"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "-w",
                            str(tmp_path / "whl"), "--no-deps", "--no-build-isolation", "-q"],
                           capture_output=True, text=True, timeout=600, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "whl").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    # Installed, the package reads its shipped models from tvm_costfuse/tuning_logs/
    # (records/database.py's SHIPPED_LOGS): the wheel must put them there, and nothing at the
    # top of site-packages.
    from tvm_costfuse.records import database

    assert database._INSTALLED_LOGS == Path(database.__file__).resolve().parents[1] / \
        "tuning_logs"
    trained = sorted(ROOT.glob(f"tuning_logs/*/groups/{META_FILE}"))
    assert trained
    for meta in trained:
        folder = f"tvm_costfuse/tuning_logs/{meta.parent.parent.name}/groups"
        for name in (MODEL_FILE, META_FILE, POINTS_FILE):
            assert f"{folder}/{name}" in names, sorted(n for n in names if "tuning" in n)
    assert not any(n.startswith("tuning_logs/") for n in names)
    assert not any(n.endswith((".jsonl", ".bak")) for n in names)  # measurements stay home
    assert wheel.stat().st_size < 10 * 2**20
