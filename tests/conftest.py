"""Shared fixtures: prepared zoo models and their unfused reference outputs, built once."""

from __future__ import annotations

import functools
import os

# Plans must not depend on a host calibration someone left in ~/.cache: use the defaults.
os.environ["TVM_COSTFUSE_CALIBRATION"] = "none"

import numpy as np
from hypothesis import HealthCheck, settings

from tvm_costfuse import models
from tvm_costfuse.measurement.timing import build, run
from tvm_costfuse.pipelines import prepare

# CI draws the same plans every run (a red CI must be reproducible); set
# HYPOTHESIS_PROFILE=explore locally to draw new ones.
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile("explore", parent=settings.get_profile("ci"), derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@functools.cache
def prepared(name: str, small: bool = True):
    """(module after the pre-fusion passes, example inputs) for a zoo model."""
    mod, inputs = models.load(name, small=small)
    return prepare(mod), inputs


@functools.cache
def reference(name: str) -> list[np.ndarray]:
    """Outputs of the small model built with no fusion at all."""
    mod, inputs = prepared(name)
    return run(build(mod, fusion=None), inputs)
