"""``relax.frontend.nn`` module -> IRModule with seeded random weights bound as constants.

Weights use He/Xavier-like scales and norms start near identity so that outputs are finite and
O(1): results are compared across compilation strategies at ``rtol ~ 1e-4``. The seed is the
model's name (crc32, not ``hash()``, which is salted per process), so a name means the same
weights and inputs in every process.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend import nn

from .blocks import F32


@dataclass(frozen=True)
class Spec:
    """How to build one model: the nn module and its ordered input shapes."""

    module: nn.Module
    inputs: dict[str, tuple[int, ...]]


def seeded_rng(name: str) -> np.random.Generator:
    """Seed from the name with crc32, not hash(): hash() is salted per process."""
    return np.random.default_rng(zlib.crc32(name.encode()))


def _owner(root: nn.Module, path: str) -> tuple[nn.Module, str]:
    """Resolve ``"blocks.0.bn.gamma"`` to (the module holding it, ``"gamma"``)."""
    *parts, attr = path.split(".")
    obj = root
    for part in parts:
        obj = obj[int(part)] if isinstance(obj, nn.ModuleList) else getattr(obj, part)
    return obj, attr


def _init_value(
    owner: nn.Module, attr: str, shape: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """A module's own ``init_param`` wins; otherwise He for convs, Xavier-like for linears,
    ~1 for norm weights, ~0 for biases."""
    hook = getattr(owner, "init_param", None)
    value = hook(attr, shape, rng) if hook is not None else None
    if value is not None:
        return value
    if attr == "weight" and len(shape) == 4:  # conv, fan_in = cin/groups * kh * kw
        return rng.standard_normal(shape) * math.sqrt(2.0 / int(np.prod(shape[1:])))
    if attr == "weight" and len(shape) == 2:  # linear (out, in)
        return rng.standard_normal(shape) / math.sqrt(shape[1])
    if attr == "weight":  # layer norm / rms norm gain
        return 1.0 + 0.1 * rng.standard_normal(shape)
    return 0.05 * rng.standard_normal(shape)


def build_weights(name: str, spec: Spec
                  ) -> tuple[nn.Module, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(the nn module, its weights {nn parameter path: array}, example inputs)."""
    rng = seeded_rng(name)
    weights: dict[str, np.ndarray] = {}
    for path, param in spec.module.named_parameters():
        shape = tuple(int(s) for s in param.shape)
        owner, attr = _owner(spec.module, path)
        weights[path] = np.asarray(_init_value(owner, attr, shape, rng), dtype=param.dtype)
    inputs = {k: rng.standard_normal(s).astype(F32) for k, s in spec.inputs.items()}
    return spec.module, weights, inputs


def as_main(mod: tvm.IRModule, func_name: str) -> tvm.IRModule:
    """A fresh module with ``func_name`` renamed to ``main`` (without ``num_input``) and every
    other function kept: importers emit helpers that ``main`` calls (TVM's ONNX frontend makes
    a function for each Clip/ReLU6, for one)."""
    func = mod[func_name]
    if func.attrs is not None and "num_input" in func.attrs:
        func = func.without_attr("num_input")
    # Keyed by the original GlobalVars: ``main`` calls the helpers through those objects.
    funcs = {gv: f for gv, f in mod.functions.items() if gv.name_hint != func_name}
    if any(gv.name_hint == "main" for gv in funcs):
        raise ValueError(f"cannot rename {func_name!r} to 'main': the module has a 'main' too")
    return tvm.IRModule({tvm.ir.GlobalVar("main"): func.with_attr("global_symbol", "main"),
                         **funcs})


def export(name: str, spec: Spec) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """(IRModule with only ``main``, weights bound as constants; {input name: array})."""
    module, weights, inputs = build_weights(name, spec)
    nn_spec = {"forward": {k: nn.spec.Tensor(v.shape, F32) for k, v in inputs.items()}}
    mod, params = module.export_tvm(spec=nn_spec)
    func = mod["forward"]
    # export_tvm appends one function parameter per weight, in `params` order.
    weight_vars = func.params[len(inputs) :]
    bind = {var: weights[path] for var, (path, _) in zip(weight_vars, params, strict=True)}
    mod = relax.transform.BindParams("forward", bind)(mod)
    return as_main(mod, "forward"), inputs
