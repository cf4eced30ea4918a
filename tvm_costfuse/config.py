"""Fusion configuration: ``costfuse.*`` PassContext keys and the :class:`FusionConfig` they fill.

TVM's ``PassContext`` rejects config keys nobody registered, and registration is C++ only, so
:func:`register_config_keys` has the shim (``shim``: compiled once per machine, cached) register
each key with a legalization function; TVM itself then rejects a wrong type when the
``PassContext`` is built::

    register_config_keys()
    with tvm.transform.PassContext(opt_level=3, config={"costfuse.max_chain_length": 4}):
        cfg = FusionConfig.resolve()          # max_chain_length=4, the rest defaults

Types are checked by TVM; ranges and names by :class:`FusionConfig` (``resolve`` validates).
Nothing here reads the environment (``shim`` reads its cache location, ``TVM_COSTFUSE_CACHE_DIR``).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Any

import tvm

# load_shim as _load_shim and shim_path: what config exported before the shim moved out.
from .shim import load_shim as _load_shim  # noqa: F401
from .shim import register_keys, shim_path

__all__ = [
    "CONFIG_KEYS",
    "COST_MODELS",
    "HORIZONTAL",
    "INT_RANGES",
    "PREFIX",
    "SEARCHES",
    "FusionConfig",
    "register_config_keys",
    "shim_path",
]

PREFIX = "costfuse."
COST_MODELS = ("analytical", "xgb", "measured")
SEARCHES = ("greedy", "exact")
HORIZONTAL = ("cost", "never", "always")
LAYOUTS = ("cost", "never", "always")

# PassContext key -> TVM type string ("int" or "str", what ``PassContext.list_configs`` shows).
CONFIG_KEYS: dict[str, str] = {
    "costfuse.max_chain_length": "int",
    "costfuse.max_body_ops": "int",
    "costfuse.register_budget": "int",
    "costfuse.cost_model": "str",
    "costfuse.search": "str",
    "costfuse.max_args": "int",
    "costfuse.target_preset": "str",
    "costfuse.horizontal": "str",
    "costfuse.layout": "str",
}

# Inclusive ranges for the int keys (why: see the field comments on FusionConfig).
INT_RANGES: dict[str, tuple[int, int]] = {
    "max_chain_length": (1, 256),
    "max_body_ops": (1, 1024),
    "register_budget": (16, 255),
    "max_args": (2, 512),
}
_CHOICES: dict[str, tuple[str, ...]] = {"cost_model": COST_MODELS, "search": SEARCHES,
                                        "horizontal": HORIZONTAL, "layout": LAYOUTS}
_PRESET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


@dataclass(frozen=True)
class FusionConfig:
    """Knobs of the fusion planner; one value per ``costfuse.<field>`` PassContext key.

    Build it with :meth:`resolve` inside a pass (reads the current ``PassContext``), or
    directly in tests. When both caps apply, the smaller one binds (a chain of 8 cannot form in a
    group capped at 4 ops).
    """

    # Longest producer->consumer chain in one group: room for a 16-30-op elementwise chain in
    # one kernel (each op inlined, so length costs nothing but code size), while CUDA code for
    # chains whose ops read their input twice grows exponentially past ~64 ops. Upper bound:
    # relax FuseOps' own depth cap (kMaxFusedOps = 256, key relax.FuseOps.max_depth).
    max_chain_length: int = 32
    # Most ops in one group: bounds FuseTIR/schedule time per kernel; wide horizontal groups
    # (e.g. 12 parallel heads' epilogues) still fit. 1024 is a sanity ceiling, not a hardware one.
    max_body_ops: int = 64
    # CUDA registers per thread a fused kernel may need; a merge predicted above it is rejected.
    # 255 is the per-thread hardware cap (sm_35+), so by default only what must spill counts.
    # (CPU groups are priced against the target's vector registers instead.) Floor 16: no
    # useful kernel fits below it.
    register_budget: int = 255
    # "analytical" (roofline-style estimate, no training data), "xgb" (learned from measured
    # runs) or "measured" (groups measured in tuning_logs/ priced by their measurement, the
    # rest analytically).
    cost_model: str = "analytical"
    # "greedy" (pairwise merges by score) or "exact" (enumerate legal partitions; small graphs).
    search: str = "greedy"
    # Buffers (inputs + outputs) per fused kernel. TVM itself caps this only where the target
    # kind sets ``max_function_args`` (Metal 31, OpenCL 128); llvm, CUDA, ROCm, Vulkan set none
    # (unlimited). 64 keeps launches cheap; 512 = 4 KiB CUDA parameter space / 8-byte pointers.
    max_args: int = 64
    # Name of a target description ("h100", "host", ...); None: derived from the target.
    target_preset: str | None = None
    # Sibling matmuls of one input as one matmul of their weights concatenated
    # (``siblings.py``): "cost" where the cost model prices it faster, "never", or "always"
    # (the trivial baselines its decisions are measured against).
    horizontal: str = "cost"
    # Depthwise and 1x1 convolutions channels-last (``layouts.py``): "cost" where the cost
    # model prices the model faster so, "never", or "always" (the trivial baselines). Off by
    # default: on 14 corpus CNNs its cost decision is right on 19 of 22 clear cases at 1 and 2
    # threads, but kept NCHW on mnasnet1_0 at 1 thread (channels-last 1.07x) and googlenet at 2
    # (1.11x) and chose channels-last on regnet_y_400mf at 1 (0.96x) (docs/log/2026-12-08.md).
    layout: str = "never"

    def __post_init__(self) -> None:
        for name, (lo, hi) in INT_RANGES.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{PREFIX}{name} must be an int, got {value!r}")
            if not lo <= value <= hi:
                raise ValueError(f"{PREFIX}{name} must be in [{lo}, {hi}], got {value}")
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(
                    f"{PREFIX}{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}"
                )
        preset = self.target_preset
        if preset is not None and not (isinstance(preset, str) and _PRESET_NAME.fullmatch(preset)):
            raise ValueError(
                f"{PREFIX}target_preset must be None or a name like 'h100' or 'host' "
                f"(letters, digits, '_', '-', '.'), got {preset!r}"
            )

    @classmethod
    def resolve(cls, **overrides: Any) -> FusionConfig:
        """Config from the current ``PassContext``'s ``costfuse.*`` keys, then ``overrides``.

        Overrides that are ``None`` are ignored, so a pass can forward its own optional
        arguments unchanged; the others win over the context. Raises ``ValueError`` (naming the
        key) when a value is out of range, ``TypeError`` for an unknown override name.
        """
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise TypeError(f"unknown FusionConfig field(s) {unknown}; known: {sorted(fields)}")
        values: dict[str, Any] = {}
        config = tvm.transform.PassContext.current().config
        for key, value in config.items():
            name = str(key).removeprefix(PREFIX)
            if str(key).startswith(PREFIX) and name in fields:
                values[name] = _plain(value)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _plain(value: Any) -> Any:
    """FFI values as plain Python ones (tvm_ffi strings -> ``str``), so configs compare/hash."""
    if isinstance(value, str):
        return str(value)
    return value


# --- registration (the C++ shim itself: ``shim``) -------------------------------------------


def register_config_keys(cache_dir: str | os.PathLike | None = None) -> None:
    """Register the ``costfuse.*`` keys in TVM's PassContext (idempotent, thread-safe).

    The first call on a machine compiles a small C++ shim (about 1.5 s); later processes load
    the cached shim (about 1 ms); later calls in the same process return at once. Keys that TVM
    already knows (e.g. registered by another copy of this module) are skipped; one registered
    with a different type is an error.

    Parameters
    ----------
    cache_dir
        Where the compiled shim is cached; default ``$TVM_COSTFUSE_CACHE_DIR`` or
        ``~/.cache/tvm_costfuse`` (``shim`` says how a torn cached shim is caught).

    Raises
    ------
    RuntimeError
        When the shim cannot be built or loaded, or a key clashes; never skips silently.
    """
    register_keys(CONFIG_KEYS, cache_dir)
