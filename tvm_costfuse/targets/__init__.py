"""Targets: what CostFuse compiles for and what it prices a plan with, resolved in one place.

- ``desc`` -- :class:`TargetDesc`, the frozen machine figures, and the GPU presets;
- ``machine`` -- the host CPU's description (sysfs, LLVM, calibration record);
- ``calibration`` -- the calibration records per CPU and core count, measured on first use;
- ``cpu_id`` -- which CPU this is (LLVM name, model string), what both are keyed by;
- ``isa``  -- cores, SIMD width and vector registers of an LLVM target, read by schedules too.

:func:`resolve` takes a preset name (``host``, ``h100``, ``h200``, ``a100``; ``llvm`` and
``cuda`` too), a ``tvm.target.Target`` (or its dict / tag form), a :class:`TargetDesc` or a
:class:`Target`, and returns one :class:`Target` that knows both the TVM target it compiles
for and the description it prices with. A new target is a preset in ``desc`` (or a CPU that
``host`` describes) and nothing else.
"""

from __future__ import annotations

import dataclasses
import re

import tvm

from . import isa
from .calibration import CALIBRATION_PATH, load_calibration, save_calibration
from .cpu_id import host_cpu, host_cpu_model
from .desc import (
    A100,
    CPU,
    CUDA,
    CUDA_ARCH_DEFAULT,
    GPU_PRESETS,
    H100,
    H200,
    KiB,
    MiB,
    TargetDesc,
    cuda_target,
)
from .machine import host, host_caches, host_target

__all__ = [
    "A100", "CALIBRATION_PATH", "CPU", "CUDA", "H100", "H200", "KiB", "MiB", "Target",
    "TargetDesc", "compile_target", "cuda_target", "for_pipeline", "for_target", "host", "host_caches", "host_cpu",
    "host_cpu_model", "host_target", "isa", "load_calibration", "preset", "preset_names",
    "resolve", "save_calibration",
]

# The GPU a bare "cuda" name means: the machine the project's GPU checks run on.
DEFAULT_GPU = "h200"


@dataclasses.dataclass(frozen=True)
class Target:
    """A TVM target and the description its plans are priced with."""

    tvm: tvm.target.Target
    desc: TargetDesc

    @property
    def kind(self) -> str:
        """``"llvm"`` or ``"cuda"``: the TVM target kind."""
        return self.tvm.kind.name

    @property
    def name(self) -> str:
        return self.desc.name

    def device(self):
        """The runtime device kernels for this target run on."""
        return tvm.cuda() if self.kind == "cuda" else tvm.cpu()


def preset_names() -> list[str]:
    """Names :func:`preset` accepts, GPUs first."""
    return [*GPU_PRESETS, "host"]


def preset(name: str) -> TargetDesc:
    """A target description by name, case-insensitive: h100, h200, a100 or host."""
    key = name.strip().lower()
    if key == "host":
        return host()
    if key not in GPU_PRESETS:
        raise ValueError(f"unknown target {name!r}; valid names: {', '.join(preset_names())}")
    return GPU_PRESETS[key]


def for_target(target, gpu: str | None = None) -> TargetDesc:
    """The description for a ``tvm.target.Target`` (or its dict / string / tag form).

    llvm -> :func:`host` with the target's ``num-cores`` and ``mcpu`` (a CPU other than this
    one, or none: generic x86-64, is described with its own vector width, as the schedules
    tile for it); cuda -> the preset named ``gpu`` when given,
    else by arch (sm_90/sm_90a -> h100, sm_80 -> a100).
    """
    target = tvm.target.Target(target)
    kind = target.kind.name
    if kind == "llvm":
        cores = target.attrs.get("num-cores")
        # No mcpu is LLVM's generic x86-64 (SSE2): the ISA its kernels are compiled for.
        mcpu = str(target.attrs.get("mcpu", "") or "") or "x86-64"
        return host(num_cores=int(cores) if cores else None,
                    mcpu=None if mcpu == host_cpu() else mcpu)
    if kind == "cuda":
        if gpu is not None:
            return preset(gpu)
        arch = re.sub(r"[a-z]$", "", str(target.attrs.get("arch", "")))  # sm_90a -> sm_90
        if arch not in CUDA_ARCH_DEFAULT:
            raise ValueError(
                f"no preset for CUDA arch {arch!r}; known: {sorted(CUDA_ARCH_DEFAULT)} "
                f"(pass gpu= one of {', '.join(GPU_PRESETS)})"
            )
        return GPU_PRESETS[CUDA_ARCH_DEFAULT[arch]]
    raise ValueError(f"no target description for TVM target kind {kind!r} (llvm or cuda)")


def resolve(spec=None, *, gpu: str | None = None, desc: TargetDesc | None = None) -> Target:
    """One :class:`Target` from whatever names a target.

    Parameters
    ----------
    spec
        None (``Target.current()``); a name: ``host`` or ``llvm`` (this CPU with its real ISA,
        as :func:`host_target`), ``h100``, ``h200``, ``a100``, ``cuda`` (the ``gpu`` preset,
        default :data:`DEFAULT_GPU`); a ``tvm.target.Target`` or its dict form, taken as it is
        (an llvm target without ``mcpu`` is generic x86-64); a :class:`TargetDesc`; a
        :class:`Target`.
    gpu
        The preset a CUDA target is priced as (default: by arch, see :func:`for_target`).
    desc
        Price with this description instead of the one derived from ``spec``.
    """
    if isinstance(spec, Target):
        return spec if desc is None else Target(spec.tvm, desc)
    if isinstance(spec, TargetDesc):
        return Target(spec.tvm_target(), desc or spec)
    key = spec.strip().lower() if isinstance(spec, str) else None
    if key in ("host", "llvm"):
        target = host_target()
        return Target(target, desc or for_target(target))
    target = compile_target(spec, gpu)
    key = gpu or DEFAULT_GPU if key == "cuda" else key
    if key in GPU_PRESETS:
        return Target(target, desc or GPU_PRESETS[key])
    return Target(target, desc or for_target(target, gpu))


def for_pipeline(spec=None) -> Target:
    """What a pipeline built for ``spec`` compiles for (:func:`compile_target`) and prices with:
    a preset's, ``"host"``'s or a given description's own, else the compile target's (so a plain
    ``"llvm"`` is scheduled and priced as the generic x86-64 ``tvm.compile`` builds it for)."""
    if isinstance(spec, (Target, TargetDesc)):
        return resolve(spec)
    named = isinstance(spec, str) and spec.strip().lower() in (*preset_names(), "cuda")
    return resolve(spec) if named else resolve(compile_target(spec))


def compile_target(spec=None, gpu: str | None = None) -> tvm.target.Target:
    """What to compile ``spec`` for, without describing it for pricing: what the pipelines
    take. As :func:`resolve` does, except that a plain ``"llvm"`` keeps TVM's meaning (generic
    x86-64, what ``tvm.compile(target="llvm")`` compiles for: a pipeline must schedule for
    the ISA the module is compiled for); ``"host"`` is this CPU."""
    if isinstance(spec, Target):
        return spec.tvm
    if isinstance(spec, TargetDesc):
        return spec.tvm_target()
    if spec is None:
        current = tvm.target.Target.current()
        if current is None:
            raise ValueError("no target given and none current: pass a target or run under "
                             "`with tvm.target.Target(...)`")
        return current
    if isinstance(spec, str) and not spec.strip().startswith("{"):
        key = spec.strip().lower()
        if key == "host":
            return host_target()
        if key == "cuda":
            key = gpu or DEFAULT_GPU
        if key in GPU_PRESETS:
            return GPU_PRESETS[key].tvm_target()
        spec = _cli_form(spec)
    try:
        return tvm.target.Target(spec)
    except Exception as err:
        raise ValueError(f"unknown target {spec!r}; valid names: "
                         f"{', '.join([*preset_names(), 'llvm', 'cuda'])}, or a target such as "
                         "'llvm -mcpu=znver3' or 'cuda -arch=sm_90'") from err


def _cli_form(text: str) -> dict | str:
    """``"llvm -mcpu=znver3 -num-cores=2"`` -> ``{"kind": "llvm", "mcpu": "znver3",
    "num-cores": 2}``: the target string TVM users write (``tvmc``), which TVM 0.27's
    ``Target`` no longer parses (it takes the dict). ``-mattr`` takes a comma-separated list;
    integers become ints. Anything else is returned as it is, for ``Target`` to judge."""
    kind, *options = text.split()
    out: dict = {"kind": kind}
    for option in options:
        key, sep, value = option.lstrip("-").partition("=")
        if not option.startswith("-") or not sep or not key:
            return text
        out[key] = (value.split(",") if key == "mattr" else
                    int(value) if value.lstrip("-").isdigit() else value)
    return out if options else text
