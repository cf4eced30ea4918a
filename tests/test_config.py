"""costfuse.* PassContext keys: TVM checks their types, FusionConfig their ranges and names."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import tvm

from tvm_costfuse.config import CONFIG_KEYS, FusionConfig, register_config_keys

register_config_keys()

# One valid, non-default value per key.
NON_DEFAULT = {
    "max_chain_length": 3,
    "max_body_ops": 16,
    "register_budget": 128,
    "cost_model": "xgb",
    "search": "exact",
    "max_args": 32,
    "target_preset": "h100",
    "horizontal": "never",
    "layout": "always",
}


def _ctx(**values):
    return tvm.transform.PassContext(
        opt_level=3, config={f"costfuse.{k}": v for k, v in values.items()}
    )


def test_keys_registered_with_tvm_types():
    known = tvm.transform.PassContext.list_configs()
    assert {k: str(known[k]["type"]) for k in CONFIG_KEYS} == CONFIG_KEYS
    assert set(NON_DEFAULT) == {k.removeprefix("costfuse.") for k in CONFIG_KEYS}


def test_register_is_idempotent():
    register_config_keys()
    register_config_keys()


@pytest.mark.parametrize("name", sorted(NON_DEFAULT))
def test_each_key_reaches_resolve(name):
    with _ctx(**{name: NON_DEFAULT[name]}):
        cfg = FusionConfig.resolve()
    assert getattr(cfg, name) == NON_DEFAULT[name]
    assert cfg == FusionConfig(**{name: NON_DEFAULT[name]})


def test_all_keys_together_and_plain_python_values():
    with _ctx(**NON_DEFAULT):
        cfg = FusionConfig.resolve()
    assert cfg == FusionConfig(**NON_DEFAULT)
    assert type(cfg.cost_model) is str and type(cfg.max_args) is int
    hash(cfg)


def test_outside_a_context_resolve_gives_defaults():
    assert FusionConfig.resolve() == FusionConfig()
    with _ctx(max_chain_length=3):
        pass
    assert FusionConfig.resolve() == FusionConfig()


def test_explicit_overrides_win_and_none_is_ignored():
    with _ctx(max_chain_length=3, search="exact"):
        cfg = FusionConfig.resolve(max_chain_length=5, search=None, max_args=8)
    assert (cfg.max_chain_length, cfg.search, cfg.max_args) == (5, "exact", 8)


def test_unknown_override_name():
    with pytest.raises(TypeError, match="max_chain"):
        FusionConfig.resolve(max_chain=3)


@pytest.mark.parametrize(
    ("key", "value", "got"),
    [
        ("max_chain_length", "eight", "str"),
        ("max_chain_length", 8.0, "float"),
        ("max_body_ops", True, "bool"),
        ("register_budget", [255], "ffi.Array"),
        ("cost_model", 1, "int"),
        ("search", b"greedy", "bytes"),
        ("target_preset", 90, "int"),
    ],
)
def test_wrong_type_rejected_by_tvm(key, value, got):
    expected = "int" if CONFIG_KEYS[f"costfuse.{key}"] == "int" else "str"
    with pytest.raises(AttributeError) as err:
        _ctx(**{key: value})
    assert f"costfuse.{key} to have type {expected}, but instead get {got}" in str(err.value)


def test_unknown_key_rejected_by_tvm():
    with pytest.raises(AttributeError, match=r"Invalid config option 'costfuse\.foo'"):
        _ctx(foo=1)


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("max_chain_length", 0, "[1, 256]"),
        ("max_chain_length", -1, "[1, 256]"),
        ("max_body_ops", 0, "[1, 1024]"),
        ("register_budget", 8, "[16, 255]"),
        ("register_budget", 256, "[16, 255]"),
        ("max_args", 1, "[2, 512]"),
        ("cost_model", "roofline", "'analytical', 'xgb'"),
        ("search", "beam", "'greedy', 'exact'"),
        ("target_preset", "", "'h100'"),
    ],
)
def test_out_of_range_rejected_by_resolve(key, value, allowed):
    with _ctx(**{key: value}), pytest.raises(ValueError) as err:
        FusionConfig.resolve()
    assert f"costfuse.{key}" in str(err.value) and allowed in str(err.value)


def test_constructor_checks_python_types():
    with pytest.raises(TypeError, match="costfuse.max_args"):
        FusionConfig(max_args="64")


_PROBE = """
import json, os, time
import tvm
import tvm_ffi.cpp
builds = []
_load_inline = tvm_ffi.cpp.load_inline
def counting_load_inline(*args, **kwargs):
    builds.append(1)
    return _load_inline(*args, **kwargs)
tvm_ffi.cpp.load_inline = counting_load_inline
# Importing the package registers the keys (compiling the shim unless it is cached).
from tvm_costfuse.config import _load_shim, register_config_keys, shim_path
register_config_keys()
t = time.perf_counter()
_load_shim(None)  # what a later process pays when the shim is cached
dt = time.perf_counter() - t
with tvm.transform.PassContext(config={"costfuse.max_args": 7}) as ctx:
    assert ctx.config["costfuse.max_args"] == 7
so = shim_path()
print(json.dumps({"seconds": dt, "compiled": bool(builds),
                  "so": str(so), "mtime": os.stat(so).st_mtime_ns}))
"""


def _probe(cache_dir, **env):
    env = {**os.environ, "TVM_COSTFUSE_CACHE_DIR": str(cache_dir), **env}
    cmd = [sys.executable, "-c", _PROBE]
    return subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=300)


def test_second_process_loads_cached_shim(tmp_path):
    first = _probe(tmp_path)
    assert first.returncode == 0, first.stderr
    second = _probe(tmp_path)
    assert second.returncode == 0, second.stderr
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    assert a["compiled"] and not b["compiled"]  # only the first called load_inline
    assert a["so"] == b["so"] and a["mtime"] == b["mtime"]  # same file, not rebuilt
    assert b["seconds"] < 0.5, b["seconds"]  # loading the cached shim is cheap


def test_missing_toolchain_is_a_clear_error(tmp_path):
    # No ninja or compiler on PATH and an empty cache: must raise, never skip silently.
    proc = _probe(tmp_path, PATH=str(tmp_path / "empty-bin"))
    assert proc.returncode != 0
    assert "RuntimeError: tvm_costfuse: could not build the C++ shim" in proc.stderr
