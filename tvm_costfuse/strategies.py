"""Fusion strategies as whole TVM pipelines: what the demo, benchmarks and comparisons build.

- ``stock``: ``relax.get_default_pipeline(target)``, TVM's per-target backend pipeline (llvm:
  LegalizeOps, FuseOps, FuseTIR and no schedule at all; CUDA: the same fusion and dlight's
  rules). It is not what ``tvm.compile(mod, target)`` runs when given no pipeline: for a
  non-GPU target that resolves ``"default"`` to ``relax.get_pipeline("default")``
  (``default_build_pipeline``: legalize and lower, no FuseOps, one kernel per op; 21 kernels
  against FuseOps' 1 on the small ``elementwise_chain``), and only GPU targets get
  ``get_default_pipeline`` (``relax/vm_build.py``, TVM 0.27);
- ``none``: no fusion, our schedules; ``tvm``: FuseOps, our schedules;
- ``rules``: pattern rules plus canonical patterns (``rules.RulesFuse``), our schedules;
- ``costfuse``: the CostFuse pass, our schedules; ``costfuse-xgb``: the same with the learned
  cost model (needs one trained in ``tuning_logs/``); ``costfuse-measured``: with the measured
  cost model (measurements in ``tuning_logs/``, analytical for the rest).
Every strategy but ``stock`` shares the weight folding (:mod:`.fold`) and the schedules, so
their differences are fusion alone: CostFuse's include its horizontal step, sibling matmuls
made one before LegalizeOps where its cost model says so (:mod:`.horizontal`).
"""

from __future__ import annotations

import tvm
from tvm import relax

from .pipelines import scheduled_pipeline
from .rules import RulesFuse
from .schedules.lowering import TIR_PIPELINE
from .targets import for_pipeline
from .transform import CostFuse

STRATEGIES = ("stock", "none", "tvm", "rules", "costfuse")
# Named variants: a strategy with fixed options (not in STRATEGIES: they need trained data).
VARIANTS = {"costfuse-xgb": ("costfuse", {"cost_model": "xgb"}),
             "costfuse-measured": ("costfuse", {"cost_model": "measured"}),
             "costfuse-exact": ("costfuse", {"search": "exact"}),
             "costfuse-xgb-exact": ("costfuse", {"cost_model": "xgb", "search": "exact"}),
             # the layout step's choices (``layouts.py``): channels-last always, or by price
             "costfuse-nhwc": ("costfuse", {"layout": "always"}),
             "costfuse-layout": ("costfuse", {"layout": "cost"}),
             # weight folding off: what folding is worth, beside the same strategy with it
             "none-unfolded": ("none", {"fold": False}),
             "tvm-unfolded": ("tvm", {"fold": False}),
             "costfuse-unfolded": ("costfuse", {"fold": False})}


def split_strategy(strategy: str) -> tuple[str, dict]:
    """``costfuse-xgb`` -> ("costfuse", {"cost_model": "xgb"}); other names as they are."""
    return VARIANTS.get(strategy, (strategy, {}))


@tvm.transform.module_pass(opt_level=0, name="NoFusion")
def no_fusion(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """Groups nothing: FuseTIR then finds no Primitive function (one kernel per op)."""
    return mod


def fusion_pass(strategy: str, target: tvm.target.Target, **config) -> tvm.transform.Pass:
    if strategy == "none":
        return no_fusion
    if strategy == "tvm":
        return relax.transform.FuseOps()
    if strategy == "rules":
        return RulesFuse()
    if strategy == "costfuse":
        return CostFuse(target=target, **config)
    raise ValueError(f"unknown fusion strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")


def tir_pipeline(strategy: str = "costfuse") -> str:
    """What ``tvm.compile`` takes as ``tir_pipeline`` next to :func:`strategy_pipeline`:
    ``"costfuse"`` for every strategy with our schedules (their register tiles on the stack,
    ``schedules/lowering.py``), TVM's ``"default"`` for ``stock``."""
    return "default" if split_strategy(strategy)[0] == "stock" else TIR_PIPELINE


def strategy_pipeline(strategy: str, target, fusion=None, fold: bool = True,
                      **config) -> tvm.transform.Pass:
    """The relax pipeline that compiles a model with ``strategy`` for ``target``: anything
    :func:`~tvm_costfuse.targets.for_pipeline` takes, which says what CostFuse prices plans for
    too (a resolved :class:`~tvm_costfuse.targets.Target` or a description its own; a bare
    sm_90 target is priced as an H100).
    ``fusion``: a pass to stand in the fusion slot instead of the strategy's own (e.g.
    ``ApplyPartition`` of a plan made beforehand, so what is built is what was reported).
    ``fold``: fold weight-only work first (:mod:`.fold`; every strategy but ``stock``).
    """
    resolved = for_pipeline(target)
    target = resolved.tvm
    strategy, variant = split_strategy(strategy)
    config = {**variant, **config}
    fold = fold and config.pop("fold", True)  # off where the call or the variant says so
    if strategy == "stock":
        return relax.get_default_pipeline(target)
    # a preset name or a description keeps its own description ("h200"; its compile target
    # says only sm_90, which alone is priced as an H100): ``for_pipeline``
    fusion = fusion or fusion_pass(strategy, resolved, **config)
    return scheduled_pipeline(target, fusion, fold)
