"""Whether a CNN runs its depthwise and pointwise convolutions channels-last (NHWC): a layout
decision of CostFuse's for the whole model (``costfuse.layout``; ``cost`` asks the cost model).

Why: TVM's importers give convolutions in NCHW, where a depthwise kernel vectorizes along the
image row (a 7- or 14-wide row leaves lanes idle, stride 2 must deinterleave) and a 1x1
convolution streams pixels. Channels-last, the depthwise kernel vectorizes over channels
(``schedules/depthwise_nhwc.py``: 2.0-5.9x the NCHW kernel alone on 15 corpus shapes,
``lab/layout_kernels.py``) and a 1x1 convolution is a GEMM
whose weight is the packed vector operand. Blocked layouts carried across the conv chain are
where ONNX Runtime's CNN lead comes from (its NCHWc transformer); XNNPACK runs mobile CNNs
NHWC. FuseOps has no such choice: its pipelines keep the importer's layout.

How: TVM's ``ConvertLayout`` (with a per-call callback) turns each depthwise and 1x1
convolution NHWC (weights ``HWOI`` / ``HWIO``: the channel the kernel vectorizes over is
contiguous) and carries the layout through the ops that follow it (elementwise, pooling,
means, concatenation), placing ``permute_dims`` where an op keeps NCHW (a dense convolution,
a reshape of the channels, the model's inputs and outputs). A float ``clip`` with constant
bounds is first written as ``maximum(minimum(x, hi), lo)``, TOPI's own form of it: TVM 0.27
has no layout rule for ``clip``. Transposed convolutions stay NCHW (TVM legalizes no other
layout of them); where the converted model would still leave an op TVM cannot legalize, or
``ConvertLayout`` fails, the model stays as imported and the decision says why. CPU targets
only: the channels-last kernels are CPU rules.
``costfuse.layout``:

- ``"cost"``: the model is legalized and planned both ways, each plan priced by the cost
  model (the transposes included); channels-last where it is priced ``MIN_GAIN`` faster;
- ``"never"`` (the default), ``"always"``: the trivial baselines. ``cost`` is not the
  default: on 14 corpus CNNs it chose right on 19 of the 22 cases at 1 and 2 threads whose
  layouts differ by more than 2% (docs/log/2026-12-08.md), short of 0.9, and the labels of
  one build a variant move by a few percent between runs.

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
from .transform import CostFuse, plan_module

__all__ = ["MIN_GAIN", "ChannelsLast", "Layout", "channels_last", "convertible", "decide_layout"]

# Channels-last only where it is priced this much faster: a smaller predicted difference is
# inside what two builds of one model differ by.
MIN_GAIN = 0.02

_CONV = "relax.nn.conv2d"


@dataclass
class Layout:
    """The decision for one model: the convolutions that turned (or would turn)
    channels-last, whether they do, why, and the two prices where the cost model was asked
    (seconds). Filled in as the step decides."""

    convolutions: int
    chosen: bool = False
    why: str = ""
    prices: tuple[float, float] | None = None


def _static_shape(expr) -> tuple[int, ...] | None:
    ty = expr.ty
    dims = getattr(ty.shape, "values", None) if isinstance(ty, relax.TensorType) else None
    if dims is None:  # no shape, or one held in a Relax variable
        return None
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


_FLOAT = ("float16", "float32", "float64", "bfloat16")


@mutator
class _ClipBounds(PyExprMutator):
    """A float ``clip(x, lo, hi)`` with constant bounds as ``maximum(minimum(x, hi), lo)``
    (``topi.clip``'s order): ConvertLayout carries a layout through those two, not through
    ``clip``. Other clips (integer tensors, whose bounds may be infinite) stay."""

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.clip"):
            return call
        dtype = str(getattr(call.args[0].ty, "dtype", ""))
        bounds = call.args[1:3]
        if dtype not in _FLOAT or not all(isinstance(b, tvm.tirx.IntImm | tvm.tirx.FloatImm)
                                          for b in bounds):
            return call
        lo, hi = (relax.const(float(b.value), dtype) for b in bounds)
        return relax.op.maximum(relax.op.minimum(call.args[0], hi), lo)


def _convs(mod: tvm.IRModule, layout: str | None = None) -> int:
    """Conv2d calls of ``mod``'s Relax functions: those ``convertible`` (``layout`` None), or
    those whose data layout is ``layout``."""
    found = [0]

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) \
                and expr.op.name == _CONV:
            hit = (convertible(expr) is not None if layout is None
                   else expr.attrs.data_layout == layout)
            found[0] += hit

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found[0]


def _relax_functions(mod: tvm.IRModule) -> list[str]:
    return [gv.name_hint for gv, f in mod.functions.items() if isinstance(f, relax.Function)]


def channels_last(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its depthwise and 1x1 convolutions NHWC (module docstring)."""
    funcs = {gv: _ClipBounds().visit_expr(f) if isinstance(f, relax.Function) else f
             for gv, f in mod.functions.items()}
    mod = tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)

    def layouts(call):
        name = call.op.name
        if name == "relax.nn.conv2d_transpose" and call.attrs.data_layout == "NCHW":
            return {name: ["NCHW", "IOHW"]}
        if name != _CONV or call.attrs.data_layout != "NCHW":
            return {}
        # without a desired layout a convolution would take its producer's: say NCHW
        return {_CONV: convertible(call) or ["NCHW", "OIHW"]}

    mod = relax.transform.ConvertLayout({}, layouts)(mod)
    return relax.transform.DeadCodeElimination(_relax_functions(mod))(mod)


def _high_level_ops(mod: tvm.IRModule) -> set[str]:
    """Names of the high-level Relax ops left in ``mod`` (after LegalizeOps: those it could
    not legalize, besides the ones it never does)."""
    names: set[str] = set()

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            names.add(expr.op.name)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return names


def _price(prepared: tvm.IRModule, costfuse: CostFuse, compile_target) -> float:
    """Seconds of the plans CostFuse's planner makes of every Relax function of ``prepared``
    (legalized), as its cost model prices them."""
    config = costfuse.config()
    desc = costfuse.describe_target(config)
    with compile_target:
        return sum(plan_module(prepared, desc, config, name, compile_target=compile_target,
                               graph=build_graph(prepared, name)).seconds
                   for name in _relax_functions(prepared))


def decide_layout(mod: tvm.IRModule, costfuse: CostFuse) -> tuple[tvm.IRModule, Layout]:
    """``mod`` as the layout step hands it on (channels-last or as imported) and the
    decision, under ``costfuse``'s config's ``layout`` (module docstring)."""
    mode = costfuse.config().layout
    found = Layout(_convs(mod))
    if found.convolutions == 0:
        found.why = "no depthwise or 1x1 convolution to run channels-last"
        return mod, found
    if mode == "never":
        found.why = "costfuse.layout is 'never'"
        return mod, found
    target = costfuse.compile_target("layout")
    if target.kind.name != "llvm":
        found.why = f"the channels-last kernels are CPU rules, not {target.kind.name}'s"
        return mod, found
    try:
        converted = channels_last(mod)
    except (RuntimeError, ValueError, TypeError) as err:  # TVM's errors are RuntimeErrors
        found.why = f"ConvertLayout failed, kept as imported: {str(err).splitlines()[0]}"
        return mod, found
    with target:
        before, after = legalized(mod, target), legalized(converted, target)
    stuck = _high_level_ops(after) - _high_level_ops(before)
    if stuck:
        found.why = f"kept as imported: TVM cannot legalize {', '.join(sorted(stuck))} so"
        return mod, found
    found.convolutions = _convs(converted, "NHWC")
    if mode == "always":
        found.chosen, found.why = True, "costfuse.layout is 'always'"
        return converted, found
    found.prices = (_price(before, costfuse, target), _price(after, costfuse, target))
    nchw, nhwc = found.prices
    found.chosen = nhwc < nchw * (1 - MIN_GAIN)
    found.why = (f"predicted {nchw * 1e3:.3f} ms as imported (NCHW), {nhwc * 1e3:.3f} ms "
                 f"with {found.convolutions} convolutions channels-last")
    return (converted if found.chosen else mod), found


def ChannelsLast(costfuse: CostFuse) -> tvm.transform.Pass:  # a pass, named as TVM's
    """The layout decision as a module pass for ``costfuse``, its config's ``layout``
    deciding; the decision is kept in ``costfuse.layout_decision`` (``costfuse explain``
    prints it)."""

    @tvm.transform.module_pass(opt_level=0, name="CostFuseChannelsLast")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        out, costfuse.layout_decision = decide_layout(mod, costfuse)
        return out

    return _pass
