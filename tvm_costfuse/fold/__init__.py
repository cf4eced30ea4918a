"""Fold weight-only work into the weights, before anything is legalized or fused.

An inference-mode batch norm after a convolution is an affine map per output channel, so it
folds into the convolution's weights and a bias; parallel convolutions of one input whose
outputs are summed (the branches of reparameterizable blocks: RepVGG, MobileOne, a residual
identity) are one convolution, their kernels zero-padded to the largest, centred by their
padding, the identity as a centre tap. Both are exact up to rounding (the folded constants are
computed in float64, then rounded once). TVM's pipelines do neither: ``FoldConstant`` evaluates
only subgraphs of constants alone, and a legalized batch norm stays a kernel of four
elementwise ops (a square root per element) that fusion can merely hide in an epilogue, while
three branch convolutions stay three contractions reading the same input.

The pass works on high-level Relax (``R.nn.conv1d/2d/3d``, ``R.nn.batch_norm``, ``R.add``...),
before LegalizeOps; :func:`fold_weights` returns the module and one :class:`Fold` note per
rewritten binding, which ``costfuse explain`` prints. It leaves alone what it cannot do
exactly or without cost: a form is extended through a binding only where its value has no
other use (no convolution is computed twice); branches whose merged kernel would have more
taps than theirs together (3x1 + 1x3) stay apart; a float16 weight that the batch norm's scale
would push past the format's range stays unscaled.

- :mod:`.forms` -- the algebra: a convolution plus a per-channel affine map, two summed;
- :mod:`.rewrite` -- the bindings' forms, and the function rewritten with them.
"""

from .rewrite import Fold, FoldWeights, fold_weights

__all__ = ["Fold", "FoldWeights", "fold_weights"]
