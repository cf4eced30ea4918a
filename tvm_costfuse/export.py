"""Compile a user's model into a library a plain TVM program loads: what ``costfuse compile``
does, as TVM users know it from ``tvmc compile``.

The library is ``Executable.export_library``'s shared object: load it with
``tvm.runtime.load_module(path)`` and run it with ``relax.VirtualMachine(lib, tvm.cpu())``; no
part of CostFuse is needed at run time. Beside it, optionally, the plan as JSON (the same
report ``costfuse explain --json`` prints: groups, decisions, predicted times).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from collections.abc import Mapping

import numpy as np
import tvm

from . import models
from .config import PREFIX, FusionConfig
from .measurement.timing import build, run, scaled_error
from .report.cells import is_shape_func
from .strategies import STRATEGIES, VARIANTS, split_strategy, strategy_pipeline, tir_pipeline
from .targets import host_target, resolve

__all__ = ["check_request", "compile_model", "parse_config", "runs_here",
           "short_target"]

_FIELDS = {f.name: f.type for f in dataclasses.fields(FusionConfig)}


def parse_config(items: list[str] | None) -> dict:
    """``["max_chain_length=8", "costfuse.search=exact"]`` -> CostFuse's keyword arguments.

    Keys are :class:`~tvm_costfuse.config.FusionConfig` fields, with or without the
    ``costfuse.`` prefix of their PassContext keys; integer fields take integers. Ranges are
    checked where the pass reads them (its errors name the key)."""
    config: dict = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        key = key.strip().removeprefix(PREFIX)
        if not sep or not key:
            raise ValueError(f"--config takes key=value, got {item!r}")
        if key not in _FIELDS:
            raise ValueError(f"unknown config key {key!r}; known: {', '.join(_FIELDS)}")
        if _FIELDS[key] in (int, "int"):
            try:
                config[key] = int(value)
            except ValueError:
                raise ValueError(f"{PREFIX}{key} takes an integer, got {value!r}") from None
        else:
            config[key] = value.strip()
    return config


def runs_here(target: tvm.target.Target) -> bool:
    """Whether code built for ``target`` runs on this CPU: llvm for this host's CPU (its
    ``mcpu``, or none: generic) and architecture. Another ``mcpu`` may need instructions this
    CPU lacks (AVX-512 code on an AVX2 host dies of SIGILL), so it is not run."""
    if target.kind.name != "llvm":
        return False
    triple = str(target.attrs.get("mtriple") or "")
    mcpu = str(target.attrs.get("mcpu") or "")
    return (not triple or triple.split("-")[0] == platform.machine()) and mcpu in (
        "", str(host_target().attrs.get("mcpu") or ""))


def check_request(strategy: str, config: Mapping | None, report: str | None,
                  target=None, verify: bool = False) -> None:
    """Raise ValueError naming what is wrong with a request, before anything is built."""
    base = split_strategy(strategy)[0]
    if base not in STRATEGIES or base == "stock" or (
            strategy not in STRATEGIES and strategy not in VARIANTS):
        raise ValueError(f"unknown strategy {strategy!r}; choose costfuse, tvm or none "
                         f"(or {', '.join(VARIANTS)})")
    if config and base != "costfuse":
        raise ValueError(f"--config applies to the costfuse strategies, not {strategy!r}")
    if report is not None and base != "costfuse":
        raise ValueError("--report writes a CostFuse plan: use a costfuse strategy")
    FusionConfig(**dict(config or {}))  # its ranges and choices, each error naming its key
    if verify and target is not None and not runs_here(resolve(target).tvm):
        raise ValueError("--verify runs the library here: compile for this host (--target "
                         "host) to verify it")


def compile_model(model: str | tvm.IRModule, output: str, target="host",
                  strategy: str = "costfuse", config: Mapping | None = None,
                  report: str | None = None, inputs: Mapping[str, np.ndarray] | None = None,
                  verify: bool = False, name: str | None = None) -> dict:
    """Compile ``model`` for ``target`` with ``strategy`` and write the library to ``output``.

    Parameters
    ----------
    model
        Anything ``models.load`` takes (a registry name, an ``.onnx`` or ``.pt2`` path,
        ``package.module:function``) or a Relax IRModule (then ``inputs`` gives its example
        inputs).
    target
        Anything :func:`~tvm_costfuse.targets.resolve` takes (``host``, ``h100``, a tvm
        Target or its dict).
    strategy
        ``costfuse`` (with ``config``), ``tvm`` (FuseOps), ``none``, or a named variant
        (``costfuse-xgb``...).
    report
        Where to write the plan as JSON (CostFuse strategies only).
    verify
        Also build without fusion and check the library's outputs against it.
    name
        The model's name in the report (default: ``model`` when it is a string).

    Returns
    -------
    A summary: ``output``, ``target``, ``strategy``, ``kernels`` (launched by one run on the
    example inputs, where the target runs on this CPU: :func:`runs_here`), ``report`` and
    ``max_error`` where asked for (``verify`` needs a target that runs here).
    """
    config = dict(config or {})
    if isinstance(model, str):
        mod, example = models.load(model)
    else:
        mod, example = model, dict(inputs or {})
    check_request(strategy, config, report, target, verify)
    resolved = resolve(target)
    pipeline = strategy_pipeline(strategy, resolved, **config)
    with resolved.tvm:
        ex = tvm.compile(mod, target=resolved.tvm, relax_pipeline=pipeline,
                         tir_pipeline=tir_pipeline(strategy))
    folder = os.path.dirname(os.path.abspath(output))
    os.makedirs(folder, exist_ok=True)
    ex.export_library(output)
    summary: dict = {"output": output, "target": short_target(resolved.tvm), "strategy": strategy}
    if runs_here(resolved.tvm) and example:
        calls: list[str] = []  # run as a user's program would: from the written file
        got = run(tvm.runtime.load_module(output), example, calls=calls)
        summary["kernels"] = sum(not is_shape_func(c) for c in calls)
        if verify:
            want = run(build(mod, resolved.tvm, None, None, fold=False), example)
            summary["max_error"] = max(
                (scaled_error(g, w) for g, w in zip(got, want, strict=True)), default=0.0)
    if report is not None:
        from .report.explain import explain

        strategy_config = {**split_strategy(strategy)[1], **config}
        plan = explain(mod, resolved, **strategy_config)
        plan["model"] = name or (model if isinstance(model, str) else "<module>")
        with open(report, "w") as f:
            json.dump(plan, f, indent=1)
        summary["report"] = report
    return summary


def short_target(target: tvm.target.Target) -> str:
    """``llvm -mcpu=znver3`` rather than the target's JSON."""
    parts = [target.kind.name]
    for key in ("mcpu", "arch"):
        if target.attrs.get(key):
            parts.append(f"-{key}={target.attrs[key]}")
    return " ".join(parts)

