"""What CostFuse's pipelines do to a model before LegalizeOps, for the tools that plan it.

CostFuse makes two decisions on the high-level ops, ahead of the backend's pre-fusion steps:
the layout (:mod:`.layouts`: depthwise and 1x1 convolutions channels-last) and the sibling
matmuls (:mod:`.horizontal`). Tools that plan CostFuse and build the plan themselves
(``costfuse compare``, ``regret``, ``explain``, the demo's summary) take the model through
:func:`costfuse_model` first, so that what they plan is what the pipeline builds.
"""

from __future__ import annotations

import tvm

from .fold import FoldWeights
from .horizontal import decide_siblings
from .layouts import Layout, decide_layout
from .siblings import Siblings
from .targets import resolve
from .transform import CostFuse

__all__ = ["costfuse_model"]


def costfuse_model(mod: tvm.IRModule, target, fold: bool = True, **config
                   ) -> tuple[tvm.IRModule, list[Siblings], Layout]:
    """``mod`` as CostFuse's pipeline hands it on after its weight folding (``fold``; False
    for a model folded already), layout and sibling steps (``target``: what
    :func:`~tvm_costfuse.targets.resolve` takes; ``config``: ``FusionConfig`` fields), the
    sibling sets found and the layout decision. Folding comes first, as in the pipeline: it
    folds batch norms into NCHW convolutions only."""
    resolved = resolve(target)
    costfuse = CostFuse(target=resolved, **config)
    if fold:
        mod = FoldWeights(mod)
    with resolved.tvm:
        mod, layout = decide_layout(mod, costfuse)
        mod, siblings = decide_siblings(mod, costfuse)
    return mod, siblings, layout
