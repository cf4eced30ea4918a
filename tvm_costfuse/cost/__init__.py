"""Cost models: ``features`` describes a candidate group as plain numbers (``extract``
computes them from the OpGraph), ``analytical`` prices it from first principles; the learned
model reads the same features (its files on disk: ``learned_files``); ``evaluation`` scores any
of them on measured groups (decisions, abstention, trivial baselines, time ratios)."""

from .analytical import Estimate, estimate
from .extract import group_features
from .features import FEATURE_NAMES, GroupFeatures, op_class

__all__ = ["FEATURE_NAMES", "Estimate", "GroupFeatures", "estimate", "group_features", "op_class"]
