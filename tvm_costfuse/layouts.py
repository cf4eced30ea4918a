"""Whether a CNN runs its depthwise and pointwise convolutions channels-last (NHWC): a layout
decision of CostFuse's, made by its cost model for the whole model.

Why: TVM's importers give convolutions in NCHW, where a depthwise kernel vectorizes along the
image row (a 7- or 14-wide row leaves lanes idle, stride 2 must deinterleave) and a 1x1
convolution streams pixels. Channels-last, the depthwise kernel vectorizes over channels
(``schedules/depthwise_nhwc.py``: 2-3x the NCHW kernel alone) and a 1x1 convolution is a GEMM
whose weight is the packed vector operand. Blocked layouts carried across the conv chain are
where ONNX Runtime's CNN lead comes from (its NCHWc transformer); XNNPACK runs mobile CNNs
NHWC. FuseOps has no such choice: its pipelines keep the importer's layout.

How: TVM's ``ConvertLayout`` (with a per-call callback) turns each depthwise and 1x1
convolution NHWC (weights ``HWOI`` / ``HWIO``: the channel the kernel vectorizes over is
contiguous) and carries the layout through the ops that follow it (elementwise, pooling,
means, concatenation), placing ``permute_dims`` where an op keeps NCHW (a dense convolution,
a reshape of the channels, the model's inputs and outputs). ``clip`` has no layout rule in
TVM 0.27, so it is first written as the ``maximum`` / ``minimum`` it is (the same values).
``costfuse.layout``:

- ``"cost"``: the model is legalized and planned both ways, each plan priced by the cost
  model (the transposes included); channels-last where it is priced ``MIN_GAIN`` faster;
- ``"never"``, ``"always"``: the trivial baselines.

One decision per model, not per region: a region boundary costs a transpose of the whole
activation, and deciding regions apart is left for later.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .graph import build_graph
from .horizontal import legalized
from .targets import resolve
from .transform import CostFuse, plan_module

__all__ = ["MIN_GAIN", "ChannelsLast", "Layout", "channels_last", "convertible", "decide_layout"]

# Channels-last only where it is priced this much faster: a smaller predicted difference is
# inside what two builds of one model differ by.
MIN_GAIN = 0.02

_CONV = "relax.nn.conv2d"


@dataclass
class Layout:
    """The decision for one model: the convolutions that would turn channels-last, whether
    they do, why, and the two prices where the cost model was asked (seconds)."""

    convolutions: int
    chosen: bool = False
    why: str = ""
    prices: tuple[float, float] | None = None


def _static_shape(expr) -> tuple[int, ...] | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = ty.shape.values
    if not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return tuple(int(d) for d in dims)


def convertible(call: relax.Call) -> list[str] | None:
    """The (data, kernel) layouts a conv2d call turns to: NHWC with ``HWOI`` weights for a
    depthwise convolution (multiplier 1), ``HWIO`` for a 1x1 one; None for the rest (dense
    windows stay NCHW: the direct convolution kernel runs them near the FMA peak), for other
    layouts and dtypes than NCHW / OIHW float32, and for symbolic shapes."""
    attrs = call.attrs
    if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NCHW", "OIHW", "NCHW"):
        return None
    data, weight = _static_shape(call.args[0]), _static_shape(call.args[1])
    if data is None or weight is None or len(data) != 4:
        return None
    if str(call.args[0].ty.dtype) != "float32":
        return None
    out_channels, per_group, kh, kw = weight
    if int(attrs.groups) == data[1] == out_channels and per_group == 1:
        return ["NHWC", "HWOI"]
    if int(attrs.groups) == 1 and kh == kw == 1:
        return ["NHWC", "HWIO"]
    return None


@mutator
class _ClipBounds(PyExprMutator):
    """``clip(x, lo, hi)`` as ``minimum(maximum(x, lo), hi)``: ConvertLayout carries a layout
    through those two, not through ``clip``."""

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.clip":
            dtype = str(call.args[0].ty.dtype)
            lo = relax.const(float(call.args[1].value), dtype)
            hi = relax.const(float(call.args[2].value), dtype)
            return relax.op.minimum(relax.op.maximum(call.args[0], lo), hi)
        return call


def _count(mod: tvm.IRModule) -> int:
    found = [0]

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) \
                and expr.op.name == _CONV and convertible(expr) is not None:
            found[0] += 1

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found[0]


def channels_last(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its depthwise and 1x1 convolutions NHWC (module docstring)."""
    funcs = {}
    for gv, func in mod.functions.items():
        funcs[gv] = (_ClipBounds().visit_expr(func) if isinstance(func, relax.Function)
                     else func)
    mod = tvm.IRModule(funcs, attrs=mod.attrs)

    def layouts(call):
        if call.op.name != _CONV:
            return {}
        # no desired layout would let a convolution take its producer's: say NCHW
        return {_CONV: convertible(call) or ["NCHW", "OIHW"]}

    mod = relax.transform.ConvertLayout({}, layouts)(mod)
    return relax.transform.DeadCodeElimination()(mod)


def _price(mod: tvm.IRModule, costfuse: CostFuse, compile_target) -> float:
    """Seconds of the plan CostFuse's planner makes of ``mod`` (legalized as the pipeline
    would), as its cost model prices it."""
    config = costfuse.config()
    with compile_target:
        prepared = legalized(mod, compile_target)
        plan = plan_module(prepared, costfuse.describe_target(config), config,
                           compile_target=compile_target, graph=build_graph(prepared))
    return plan.seconds


def decide_layout(mod: tvm.IRModule, costfuse: CostFuse) -> tuple[tvm.IRModule, Layout]:
    mode = costfuse.config().layout
    found = Layout(_count(mod))
    if found.convolutions == 0:
        found.why = "no depthwise or 1x1 convolution to run channels-last"
        return mod, found
    if mode != "cost":
        found.chosen, found.why = mode == "always", f"costfuse.layout is {mode!r}"
        return (channels_last(mod) if found.chosen else mod), found
    compile_target = tvm.target.Target.current()
    if compile_target is None and costfuse.target is not None:
        compile_target = resolve(costfuse.target).tvm
    if compile_target is None:
        raise ValueError("the layout step prices plans for the compile target: give CostFuse "
                         "a target or run it under `with target`")
    converted = channels_last(mod)
    found.prices = (_price(mod, costfuse, compile_target),
                    _price(converted, costfuse, compile_target))
    nchw, nhwc = found.prices
    found.chosen = nhwc < nchw * (1 - MIN_GAIN)
    found.why = (f"predicted {nchw * 1e3:.3f} ms as imported (NCHW), {nhwc * 1e3:.3f} ms "
                 f"with {found.convolutions} convolutions channels-last")
    return (converted if found.chosen else mod), found


def ChannelsLast(costfuse: CostFuse) -> tvm.transform.Pass:  # a pass, named as TVM's
    """The layout decision as a module pass for ``costfuse``, its config's ``layout``
    deciding; the decision is kept in ``costfuse.layout_decision`` (``costfuse explain`` prints it)."""

    @tvm.transform.module_pass(opt_level=0, name="CostFuseChannelsLast")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        out, costfuse.layout_decision = decide_layout(mod, costfuse)
        return out

    return _pass
