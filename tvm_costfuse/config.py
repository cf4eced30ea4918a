"""Fusion configuration: ``costfuse.*`` PassContext keys and the :class:`FusionConfig` they fill.

TVM's ``PassContext`` rejects config keys nobody registered, and registration is C++ only
(``PassContext::RegisterConfigOption``, exported by ``libtvm_compiler.so``). So
:func:`register_config_keys` compiles a tiny shim with ``tvm_ffi.cpp.load_inline`` once per
machine (cached under ``~/.cache/tvm_costfuse/``) and registers each key with a legalization
function, so that TVM itself rejects a wrong type when the ``PassContext`` is built::

    register_config_keys()
    with tvm.transform.PassContext(opt_level=3, config={"costfuse.max_chain_length": 4}):
        cfg = FusionConfig.resolve()          # max_chain_length=4, the rest defaults

Types are checked by TVM; ranges and names by :class:`FusionConfig` (``resolve`` validates).
Nothing here reads the environment except the shim's cache location (``TVM_COSTFUSE_CACHE_DIR``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi

__all__ = [
    "CONFIG_KEYS",
    "COST_MODELS",
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

# PassContext key -> TVM type string ("int" or "str", what ``PassContext.list_configs`` shows).
CONFIG_KEYS: dict[str, str] = {
    "costfuse.max_chain_length": "int",
    "costfuse.max_body_ops": "int",
    "costfuse.register_budget": "int",
    "costfuse.cost_model": "str",
    "costfuse.search": "str",
    "costfuse.max_args": "int",
    "costfuse.target_preset": "str",
}

# Inclusive ranges for the int keys (why: see the field comments on FusionConfig).
INT_RANGES: dict[str, tuple[int, int]] = {
    "max_chain_length": (1, 256),
    "max_body_ops": (1, 1024),
    "register_budget": (16, 255),
    "max_args": (2, 512),
}
_CHOICES: dict[str, tuple[str, ...]] = {"cost_model": COST_MODELS, "search": SEARCHES}
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


# --- registration ----------------------------------------------------------------------------

# The legalization functions live in the shim: TVM calls them while building every PassContext
# that carries the key, so the shim stays loaded for the life of the process.
_SHIM_SOURCE = r"""
#include <functional>
#include <string>

namespace tvm {
namespace transform {
// Forward declaration of the exported (private in TVM's header, which the wheel does not ship)
// static member; access does not enter the mangled name.
class PassContext {
 public:
  static void RegisterConfigOption(const char* key, ::tvm::ffi::String value_type_str,
                                   std::function<::tvm::ffi::Any(::tvm::ffi::Any)> legalization);
};
}  // namespace transform
}  // namespace tvm

namespace {
using ::tvm::ffi::Any;

// Python-facing name of what was passed (TVM's own message says "ffi.SmallStr" for a str).
std::string PyTypeName(const Any& value) {
  switch (value.type_index()) {
    case ::tvm::ffi::TypeIndex::kTVMFFIStr:
    case ::tvm::ffi::TypeIndex::kTVMFFISmallStr:
    case ::tvm::ffi::TypeIndex::kTVMFFIRawStr:
      return "str";
    case ::tvm::ffi::TypeIndex::kTVMFFIBytes:
    case ::tvm::ffi::TypeIndex::kTVMFFISmallBytes:
      return "bytes";
    default:
      return value.GetTypeKey();
  }
}

// Same wording as TVM's own RegisterConfigOption<T> ("Expect config K to have type T, ...").
[[noreturn]] void Mismatch(const std::string& key, const char* type, const Any& value) {
  TVM_FFI_THROW(AttributeError) << "Expect config " << key << " to have type " << type
                                << ", but instead get " << PyTypeName(value);
}
}  // namespace

// kind: "int" (Python int only; bool and float rejected) or "str" (Python str only).
void costfuse_register_config(::tvm::ffi::String key, ::tvm::ffi::String kind) {
  std::string k = key;
  std::function<Any(Any)> legalize;
  if (kind == "int") {
    legalize = [k](Any value) -> Any {
      if (value.type_index() != ::tvm::ffi::TypeIndex::kTVMFFIInt) Mismatch(k, "int", value);
      return value;
    };
  } else if (kind == "str") {
    legalize = [k](Any value) -> Any {
      auto s = value.try_cast<::tvm::ffi::String>();
      if (!s.has_value()) Mismatch(k, "str", value);
      return *s;
    };
  } else {
    TVM_FFI_THROW(ValueError) << "costfuse shim: unknown config kind '" << kind << "'";
  }
  ::tvm::transform::PassContext::RegisterConfigOption(k.c_str(), kind, legalize);
}
"""

_LOCK = threading.Lock()
_REGISTERED = False
_SHIM = None  # the loaded tvm_ffi Module; kept so its code outlives every registered key


def _compiler_lib_dir() -> Path:
    """Directory of the libtvm_compiler this process loaded (the shim must bind to that one)."""
    loaded = getattr(tvm.base, "_LOADED_LIBS", {}).get("tvm_compiler")
    if loaded is not None and getattr(loaded, "_name", None):
        return Path(loaded._name).resolve().parent
    bundled = Path(tvm.__file__).resolve().parent / "lib"
    if (bundled / "libtvm_compiler.so").exists() and not getattr(tvm.base, "_RUNTIME_ONLY", False):
        return bundled
    raise RuntimeError(
        "tvm_costfuse: libtvm_compiler is not loaded (runtime-only TVM build?); "
        "costfuse.* PassContext keys need it to be registered"
    )


def _build_dir(lib_dir: Path, cache_dir: str | os.PathLike | None) -> Path:
    root = cache_dir or os.environ.get("TVM_COSTFUSE_CACHE_DIR") or "~/.cache/tvm_costfuse"
    ident = "\0".join([_SHIM_SOURCE, tvm.__version__, tvm_ffi.__version__, str(lib_dir)])
    digest = hashlib.sha256(ident.encode()).hexdigest()[:16]
    return Path(root).expanduser() / f"passconfig_{digest}"


def shim_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where the compiled shim is (or will be) cached for this TVM install."""
    return _build_dir(_compiler_lib_dir(), cache_dir) / "costfuse_passconfig.so"


def _load_shim(cache_dir: str | os.PathLike | None) -> tvm_ffi.Module:
    lib_dir = _compiler_lib_dir()
    build_dir = _build_dir(lib_dir, cache_dir)
    so = build_dir / "costfuse_passconfig.so"
    if so.exists():
        # Cached: load it directly (~1 ms); load_inline would rehash the source and run ninja
        # (~5 ms, and ninja must then be installed wherever the cache is reused).
        # If it is half-written by a concurrent build, go through load_inline's lock and ninja.
        with contextlib.suppress(Exception):
            return tvm_ffi.load_module(str(so))
    try:
        from tvm_ffi import cpp as ffi_cpp  # the C++ builder, only needed on a cache miss

        return ffi_cpp.load_inline(
            "costfuse_passconfig",
            cpp_sources=_SHIM_SOURCE,
            functions=["costfuse_register_config"],
            extra_ldflags=[f"-L{lib_dir}", "-ltvm_compiler", f"-Wl,-rpath,{lib_dir}"],
            build_directory=str(build_dir),
        )
    except Exception as err:
        raise RuntimeError(
            f"tvm_costfuse: could not build the C++ shim that registers the costfuse.* "
            f"PassContext keys (needs a C++17 compiler and ninja; build dir {build_dir}, "
            f"delete it to force a rebuild): "
            f"{type(err).__name__}: {err}"
        ) from err


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
        ``~/.cache/tvm_costfuse``.

    Raises
    ------
    RuntimeError
        When the shim cannot be built or loaded, or a key clashes; never skips silently.
    """
    global _REGISTERED, _SHIM
    if _REGISTERED:
        return
    with _LOCK:
        if _REGISTERED:
            return
        known = tvm.transform.PassContext.list_configs()
        missing = {}
        for key, kind in CONFIG_KEYS.items():
            if key not in known:
                missing[key] = kind
            elif str(known[key]["type"]) != kind:
                raise RuntimeError(
                    f"tvm_costfuse: PassContext key {key} is already registered with type "
                    f"{known[key]['type']}, expected {kind}"
                )
        if missing:
            shim = _SHIM or _load_shim(cache_dir)
            for key, kind in missing.items():
                shim.costfuse_register_config(key, kind)
            _SHIM = shim
            # A shim bound to another libtvm_compiler copy would fill that copy's registry.
            lost = set(missing) - set(tvm.transform.PassContext.list_configs())
            if lost:
                raise RuntimeError(
                    f"tvm_costfuse: keys {sorted(lost)} did not reach TVM's registry"
                )
        _REGISTERED = True
