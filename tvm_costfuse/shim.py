"""The C++ shim that lets TVM's ``PassContext`` accept the ``costfuse.*`` config keys.

TVM rejects config keys nobody registered, and registration is C++ only
(``PassContext::RegisterConfigOption``, exported by ``libtvm_compiler.so``). So
:func:`register_keys` compiles a tiny shim with ``tvm_ffi.cpp.load_inline`` once per machine
and TVM install, and registers each key with a legalization function, so that TVM itself
rejects a wrong type when the ``PassContext`` is built (``config`` says which keys).

The compiled shim is cached under ``$TVM_COSTFUSE_CACHE_DIR`` when that is set (a read-only
home, a cache shared by several checkouts), else ``~/.cache/tvm_costfuse/``; one folder per
TVM install (``passconfig_<hash>``), safe to delete (the next import rebuilds it).

A cached shim is loaded only when it is whole: ``dlopen`` of a torn ELF (a build killed while
linking, a full disk) dies with SIGBUS before Python can say anything, so every import --
``costfuse --help`` included -- would crash silently. Hence a build goes to a private folder,
the finished library is renamed into place (atomic), and a stamp written after it records its
size and SHA-256; a library that does not match its stamp, or has none, is rebuilt (under a
file lock, so concurrent processes build once). Hashing the ~55 KB library costs ~0.1 ms.

A build that cannot run (no C++ compiler or ninja, an unwritable cache folder) is one line,
``RuntimeError: tvm_costfuse: could not build the C++ shim ...``, naming the cause and the
fix; in the ``costfuse`` command itself it is printed as ``costfuse: error: ...`` with exit
status 2 (the package registers the keys on import, before the command's ``main`` runs).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

import tvm
import tvm_ffi

__all__ = ["load_shim", "register_keys", "shim_path"]

_NAME = "costfuse_passconfig"
_SO = f"{_NAME}.so"
_STAMP = f"{_SO}.sha256"  # "<size> <sha256>" of the library beside it, written after it

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
_REGISTERED: set[str] = set()
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
    return _build_dir(_compiler_lib_dir(), cache_dir) / _SO


def _fingerprint(path: Path) -> str:
    data = path.read_bytes()
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}"


def _intact(so: Path) -> bool:
    """Whether ``so`` is the whole library its stamp describes (never dlopen a torn one)."""
    try:
        return (so.parent / _STAMP).read_text().strip() == _fingerprint(so)
    except OSError:  # no library, no stamp: an interrupted or pre-stamp build
        return False


def _build(lib_dir: Path, build_dir: Path) -> tvm_ffi.Module:
    """Compile into a private folder, rename the library into ``build_dir``, then stamp it."""
    from tvm_ffi import cpp as ffi_cpp  # the C++ builder, only needed on a cache miss
    from tvm_ffi.utils import FileLock

    build_dir.mkdir(parents=True, exist_ok=True)
    so = build_dir / _SO
    with FileLock(str(build_dir / "lock")):
        if _intact(so):  # another process built it while this one waited
            return tvm_ffi.load_module(str(so))
        for stale in build_dir.glob(".build-*"):  # a killed build's; none runs but this one
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=build_dir))
        try:
            module = ffi_cpp.load_inline(
                _NAME,
                cpp_sources=_SHIM_SOURCE,
                functions=["costfuse_register_config"],
                extra_ldflags=[f"-L{lib_dir}", "-ltvm_compiler", f"-Wl,-rpath,{lib_dir}"],
                build_directory=str(work),
            )
            stamp = _fingerprint(work / _SO)
            os.replace(work / _SO, so)  # the loaded copy is this inode: it stays mapped
            (work / _STAMP).write_text(stamp + "\n")
            os.replace(work / _STAMP, so.parent / _STAMP)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return module


def load_shim(cache_dir: str | os.PathLike | None = None) -> tvm_ffi.Module:
    """The shim module: the cached library when it is whole (~1 ms), else a fresh build
    (~1.5 s). Raises a one-line ``RuntimeError`` when it can be neither loaded nor built."""
    lib_dir = _compiler_lib_dir()
    build_dir = _build_dir(lib_dir, cache_dir)
    so = build_dir / _SO
    if _intact(so):
        try:  # loading directly skips load_inline's source hashing and ninja (~5 ms)
            return tvm_ffi.load_module(str(so))
        except Exception:  # noqa: BLE001  whole but unloadable (a changed TVM lib): rebuild
            (build_dir / _STAMP).unlink(missing_ok=True)
    try:
        return _build(lib_dir, build_dir)
    except Exception as err:  # noqa: BLE001  any build failure is reported as one line
        _fail(f"tvm_costfuse: could not build the C++ shim that registers the costfuse.* "
              f"PassContext keys in {build_dir}: {_cause(err)} (needs a C++17 compiler and "
              f"ninja on PATH and a writable cache folder: set TVM_COSTFUSE_CACHE_DIR)")


_TELLING = re.compile(r"error|not found|no such file|cannot|denied|permission", re.IGNORECASE)


def _cause(err: BaseException) -> str:
    """The line of a build failure that says why (ninja's message is a page of compiler
    command lines, with the reason -- ``c++: not found``, a compile error -- among them)."""
    if isinstance(err, OSError) and err.strerror:
        where = f": {err.filename}" if err.filename else ""
        return f"{type(err).__name__}: {err.strerror}{where}"
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith(("ninja exited", "stdout:", "stderr:",
                                                       "[", "FAILED:"))]
    telling = [ln for ln in useful if _TELLING.search(ln)]
    line = (telling or useful or lines or [""])[0]
    return f"{type(err).__name__}: {line[:300]}"


def _in_costfuse_command() -> bool:
    """Whether this process is the ``costfuse`` command: its console script, or
    ``python -m tvm_costfuse.cli`` (argv[0] is ``-m`` while runpy imports the package)."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) == "tvm_costfuse.cli":
        return True
    argv = list(getattr(sys, "orig_argv", ()))
    if sys.argv[:1] == ["-m"]:
        return any(a == "-mtvm_costfuse.cli" or (a == "-m" and b == "tvm_costfuse.cli")
                   for a, b in zip(argv, [*argv[1:], ""], strict=True))
    return bool(sys.argv) and Path(sys.argv[0]).name == "costfuse"


def _fail(message: str) -> NoReturn:
    """Raise ``message`` as a RuntimeError without the build's traceback chain; in the
    ``costfuse`` command, print it as a usage-style error and exit 2 (no traceback)."""
    if _in_costfuse_command():
        print(f"costfuse: error: {message.removeprefix('tvm_costfuse: ')}", file=sys.stderr)
        raise SystemExit(2)
    raise RuntimeError(message) from None


def register_keys(keys: Mapping[str, str], cache_dir: str | os.PathLike | None = None) -> None:
    """Register ``keys`` (name -> ``"int"`` or ``"str"``) in TVM's PassContext (idempotent,
    thread-safe); ``config.register_config_keys`` documents the contract."""
    global _SHIM
    if _REGISTERED.issuperset(keys):
        return
    with _LOCK:
        if _REGISTERED.issuperset(keys):
            return
        known = tvm.transform.PassContext.list_configs()
        missing = {}
        for key, kind in keys.items():
            if key not in known:
                missing[key] = kind
            elif str(known[key]["type"]) != kind:
                raise RuntimeError(
                    f"tvm_costfuse: PassContext key {key} is already registered with type "
                    f"{known[key]['type']}, expected {kind}"
                )
        if missing:
            shim = _SHIM or load_shim(cache_dir)
            for key, kind in missing.items():
                shim.costfuse_register_config(key, kind)
            _SHIM = shim
            # A shim bound to another libtvm_compiler copy would fill that copy's registry.
            lost = set(missing) - set(tvm.transform.PassContext.list_configs())
            if lost:
                raise RuntimeError(
                    f"tvm_costfuse: keys {sorted(lost)} did not reach TVM's registry"
                )
        _REGISTERED.update(keys)
