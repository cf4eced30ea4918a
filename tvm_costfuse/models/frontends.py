"""Frontends: PyTorch (``torch.export``) and ONNX models as Relax IRModules (optional extras).

Weights are bound as constants, as the zoo's are, so fusion and constant folding see them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax

from .export import as_main, seeded_rng

__all__ = ["load_exported", "load_onnx", "load_torch"]


def _scan_in_torch_dtype(op: Callable) -> Callable:
    """Converter for ``aten.cumsum`` / ``aten.cumprod`` giving PyTorch's result dtype.

    PyTorch accumulates bool and integer inputs in int64; TVM's converter keeps the input
    dtype, so a bool scan (HF position ids: ``(pos_diff != 1).cumsum(-1)``) reaches LLVM as a
    bool add, which no pipeline compiles (``Check failed: t.MatchesCode(kDLFloat)`` in
    ``CreateAdd``), and an int32 one silently gives int32.
    """

    def convert(node, importer) -> relax.Var:
        x = importer.env[node.args[0]]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs["dim"]
        dtype = str(node.meta["val"].dtype).removeprefix("torch.")
        return importer.block_builder.emit(op(x, dim, dtype))

    return convert


def _true_divide(node, importer) -> relax.Var:
    """Converter for ``aten.div.Tensor`` (``/``) in PyTorch's result dtype.

    ``/`` is true division: int64 / int64 is float32 in PyTorch. TVM's converter divides in
    the operands' dtype, so an integer ``/`` (DeBERTa's log-bucketed relative positions)
    truncates and the ``log`` after it is rejected for an int64 input. Both operands are cast
    to the dtype PyTorch computed for the result (its type promotion), then divided.
    """
    dtype = str(node.meta["val"].dtype).removeprefix("torch.")

    def operand(arg) -> relax.Expr:
        if arg in importer.env:
            value = importer.env[arg]
            return value if str(value.ty.dtype) == dtype else relax.op.astype(value, dtype)
        return relax.const(arg, dtype)  # a Python number

    lhs, rhs = node.args[:2]
    return importer.block_builder.emit(relax.op.divide(operand(lhs), operand(rhs)))


def _cat_skipping_empty(node, importer) -> relax.Var:
    """Converter for ``aten.cat``: PyTorch skips 1-d inputs of shape ``(0,)`` whatever the
    other inputs' rank (a decoder's empty KV cache concatenated with 4-d keys); TVM's concat
    rejects the mixed ranks."""
    tensors = [t for t in node.args[0]
               if not (t.meta.get("val") is not None and tuple(t.meta["val"].shape) == (0,))]
    axis = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    values = [importer.env[t] for t in tensors or node.args[0][:1]]
    if len(values) == 1:
        return values[0]
    return importer.block_builder.emit(relax.op.concat(values, axis=axis))


def _custom_converters() -> dict:
    return {"cumsum.default": _scan_in_torch_dtype(relax.op.cumsum),
            "cumprod.default": _scan_in_torch_dtype(relax.op.cumprod),
            "div.Tensor": _true_divide, "cat.default": _cat_skipping_empty,
            "concat.default": _cat_skipping_empty}


@relax.expr_functor.mutator
class _PythonIndexing(relax.PyExprMutator):
    """``take`` with PyTorch's index semantics: a negative index counts from the end.

    TVM's torch converters (``aten.index.Tensor``, as in Falcon's ``x[..., [-2], :]``) emit
    ``take(..., mode="fast")``, which reads out of bounds for a negative index, under stock
    TVM too. Constant indices are normalized here (free); computed ones get ``mode="wrap"``.
    """

    _TAKE = tvm.ir.Op.get("relax.take")

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not call.op.same_as(self._TAKE) or call.attrs.mode != "fast":
            return call
        data, indices = call.args
        axis = call.attrs.axis
        shape = getattr(data.ty, "shape", None)
        if isinstance(indices, tvm.ir.expr.GenericConst) and shape is not None and axis is not None:
            extent = shape.values[int(axis)]
            if isinstance(extent, tvm.tirx.IntImm):
                values = indices.value.numpy()
                if (values < 0).any():
                    fixed = relax.const(np.where(values < 0, values + int(extent), values))
                    return relax.op.take(data, fixed, axis=axis, mode="fast")
                return call
        if isinstance(indices, tvm.ir.expr.GenericConst):
            return call if (indices.value.numpy() >= 0).all() else relax.op.take(
                data, indices, axis=axis, mode="wrap")
        return relax.op.take(data, indices, axis=axis, mode="wrap")


def _python_indexing(mod: tvm.IRModule) -> tvm.IRModule:
    """Every Relax function of ``mod`` with :class:`_PythonIndexing` applied."""
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gv] = _PythonIndexing(mod).visit_expr(func)
    return mod


def load_torch(module, args: tuple, dynamic_shapes=None
               ) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """Import a ``torch.nn.Module`` via ``torch.export`` with its weights bound as constants.

    The example inputs are ``args`` converted to numpy, keyed by the Relax parameter names.
    ``module`` is switched to eval mode first (dropout/batch-norm must be in inference form).
    ``dynamic_shapes`` goes to ``torch.export.export`` (``torch.export.Dim`` per dimension):
    those dimensions become symbolic in Relax. Scans (cumsum, cumprod) keep PyTorch's result
    dtype (see ``_scan_in_torch_dtype``); negative indices count from the end
    (:class:`_PythonIndexing`).
    """
    try:
        import torch
        from tvm.relax.frontend.torch import from_exported_program
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "load_torch needs PyTorch: pip install 'tvm_costfuse[torch]' (torch==2.13.0)"
        ) from err
    args = tuple(args)
    with torch.no_grad():
        ep = torch.export.export(module.eval(), args, dynamic_shapes=dynamic_shapes)
    # keep_params_as_input=False (the default) binds the weights as constants.
    mod = from_exported_program(ep, keep_params_as_input=False, unwrap_unit_return_tuple=True,
                                custom_convert_map=_custom_converters())
    mod = _python_indexing(as_main(mod, "main"))
    return mod, _inputs_for(mod, args)


def _inputs_for(mod: tvm.IRModule, args) -> dict[str, np.ndarray]:
    """The torch example ``args`` as numpy arrays keyed by the imported main's parameters."""
    arrays = [a.detach().cpu().numpy() for a in args]
    params = mod["main"].params
    if len(params) != len(arrays):
        raise ValueError(f"expected {len(arrays)} inputs in the imported main, got {len(params)}")
    return {p.name: a for p, a in zip(params, arrays, strict=True)}


def _example_input(ty, rng: np.random.Generator) -> np.ndarray:
    """A random tensor for a Relax parameter type; symbolic dims (batch) become 1."""
    shape = tuple(int(s) if isinstance(s, tvm.tirx.IntImm) else 1 for s in ty.shape.values)
    dtype = str(ty.dtype)
    if dtype.startswith("float"):
        return rng.standard_normal(shape).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, 8, shape).astype(dtype)


def load_onnx(path: str) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """Import an ONNX file (initializers bound as constants) with seeded random example inputs."""
    try:
        import onnx
        from tvm.relax.frontend import onnx as relax_onnx
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("load_onnx needs onnx: pip install 'tvm_costfuse[onnx]'") from err
    model = onnx.load(str(path))
    mod = as_main(relax_onnx.from_onnx(model, keep_params_in_input=False), "main")
    rng = seeded_rng(str(model.graph.name or path))
    return mod, {p.name: _example_input(p.ty, rng) for p in mod["main"].params}


def load_exported(path: str) -> tuple[tvm.IRModule, dict[str, np.ndarray]]:
    """Import a ``torch.export`` archive (``torch.export.save``, ``.pt2``).

    The archive carries the example inputs it was exported with
    (``ExportedProgram.example_inputs``); they become the inputs, keyed by parameter name.
    """
    try:
        import torch
        from tvm.relax.frontend.torch import from_exported_program
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "load_exported needs PyTorch: pip install 'tvm_costfuse[torch]' (torch==2.13.0)"
        ) from err
    ep = torch.export.load(str(path))
    mod = from_exported_program(ep, keep_params_as_input=False, unwrap_unit_return_tuple=True,
                                custom_convert_map=_custom_converters())
    mod = _python_indexing(as_main(mod, "main"))
    if ep.example_inputs is None:
        raise ValueError(f"{path}: the archive holds no example inputs to run it with")
    args, _ = ep.example_inputs
    return mod, _inputs_for(mod, args)
