"""Build and time one candidate kernel: on this CPU, on a TVM RPC server, or as CUDA.

Each runner takes the kernel as JSON (it runs in a worker process, TVM's
``PopenPoolExecutor``, under a timeout, as meta-schedule's LocalBuilder/LocalRunner do: a
crash, an exception or a timeout becomes a failed record and the session goes on), compiles
it called from Relax VM functions -- what the kernel pays inside a model: dispatch, output
allocation, thread-pool wake-up; short kernels as a chain of calls -- and times it with
``time_evaluator``.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass

import tvm

from ..records.database import FAILED_RUN_SECS

__all__ = [
    "MeasureConfig",
    "RunnerKind",
    "build_and_profile_cuda",
    "build_and_time",
    "build_and_time_rpc",
    "build_and_time_together",
    "check_rpc_tracker",
    "runner_kind",
]


@dataclass(frozen=True)
class MeasureConfig:
    """How long to time each kernel. Small defaults: the 2 shared cores run others' jobs too."""

    repeat: int = 3
    number: int = 1
    min_repeat_ms: int = 30
    timeout_s: float = 120.0  # build + run of one kernel, worker start-up included
    isolate: bool = True  # build and run in a worker process (timeouts, crashes survive)
    # "host:port:key" of a TVM RPC tracker: build here, run on a server registered under key
    # (e.g. another machine of the target kind); None runs on this machine.
    rpc_tracker: str | None = None

    def __post_init__(self) -> None:
        for name, lo in (("repeat", 1), ("number", 1), ("min_repeat_ms", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < lo:
                raise ValueError(f"MeasureConfig.{name} must be an int >= {lo}, got {value!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"MeasureConfig.timeout_s must be > 0, got {self.timeout_s!r}")


# How long the tracker check waits for a TCP connection: a tracker that answers at all
# answers in milliseconds; TVM's own client retries for a minute instead.
_TRACKER_CONNECT_S = 5.0


def check_rpc_tracker(spec: str, timeout_s: float = _TRACKER_CONNECT_S) -> str:
    """``spec`` (``host:port:key``) unchanged once the tracker answers and has a server
    registered under ``key``; ValueError naming what is wrong otherwise. Run before measuring:
    a tracker that cannot serve would otherwise fail every candidate the same way."""
    parts = spec.rsplit(":", 2)
    if len(parts) != 3 or not all(parts) or not parts[1].isdigit():
        raise ValueError(f"RPC tracker {spec!r} is not HOST:PORT:KEY")
    host, port, key = parts[0], int(parts[1]), parts[2]
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as err:
        raise ValueError(f"RPC tracker {host}:{port} is unreachable: "
                         f"{err.strerror or type(err).__name__}") from None
    from tvm import rpc

    try:
        servers = rpc.connect_tracker(host, port).summary()["server_info"]
    except Exception as err:  # noqa: BLE001 -- something listens there, not a tracker
        raise ValueError(f"{host}:{port} does not answer as a TVM RPC tracker: {err}") from None
    keys = sorted({str(s.get("key", "")).split(":", 1)[-1] for s in servers})
    if key not in keys:
        raise ValueError(f"RPC tracker {host}:{port} has no server under key {key!r} "
                         f"(registered: {', '.join(keys) or 'none'})")
    return spec


# A kernel under this long per call is timed as CHAIN calls in one VM function, per call =
# total / CHAIN: the function's own entry and return are then paid once per chain, as a model
# pays them once for all its kernels (what calibrate's launch figure measures the same way).
CHAIN = 8
CHAIN_BELOW_S = 1e-3


def _compile_kernel(func_json: str, target_json: dict, n_out: int):
    """(VM executable, PrimFunc) of one scheduled PrimFunc called from Relax functions
    ``main`` (one call) and ``chain`` (:data:`CHAIN` independent calls). Timed through the VM,
    a kernel pays what it pays inside a model -- dispatch, output allocation from the pooled
    allocator, thread-pool wake-up -- so fused-vs-unfused comparisons see the per-kernel cost
    that fusion saves."""
    import tvm as _tvm  # worker process
    from tvm import relax as _relax
    from tvm.s_tir import meta_schedule as _ms

    from tvm_costfuse.pipelines import build_pipeline
    from tvm_costfuse.strategies import tir_pipeline

    func = _tvm.ir.load_json(func_json)
    try:
        infos = _ms.arg_info.ArgInfo.from_prim_func(func)
        if not 0 < n_out <= len(infos):
            raise ValueError(f"{n_out} outputs of a kernel with {len(infos)} parameters")
        types = [_relax.TensorType([int(d) for d in i.shape], str(i.dtype)) for i in infos]
        outs = types[-n_out:]
        bb = _relax.BlockBuilder()
        kernel = bb.add_func(func.with_attr("global_symbol", "kernel"), "kernel")
        for name, calls in (("main", 1), ("chain", CHAIN)):
            params = [_relax.Var(f"arg{i}", t) for i, t in enumerate(types[:-n_out])]
            with bb.function(name, params):
                results = [bb.emit(_relax.call_tir(kernel, params, outs if n_out > 1 else outs[0]))
                           for _ in range(calls)]
                bb.emit_func_output(results[0] if calls == 1 else _relax.Tuple(results))
        target = _tvm.target.Target(target_json)
        mod = bb.get()
        # The kernel comes scheduled: a schedule pass the pipeline adds (CUDA's dlight rules,
        # where a kernel needs one to build) skips it so marked. Fusing nothing.
        mod["kernel"] = mod["kernel"].with_attr("tirx.is_scheduled", True)
        return _tvm.compile(mod, target, relax_pipeline=build_pipeline(target),
                            tir_pipeline=tir_pipeline()), func
    except Exception as err:  # noqa: BLE001 -- any build error is a measured outcome
        raise RuntimeError(f"build: {type(err).__name__}: {err}") from None


def _sampler(vm, func, n_out: int, dev, number: int, repeat: int, min_repeat_ms: int
             ) -> Callable[[], list[float]]:
    """Random inputs of the buffer shapes on ``dev`` and one warm-up call; then a function
    that times ``repeat`` samples (seconds per call: short kernels run as a chain of
    :data:`CHAIN` calls)."""
    import time

    import numpy as np
    import tvm as _tvm  # worker process
    from tvm.s_tir import meta_schedule as _ms

    rng = np.random.default_rng(0)
    args = []
    for info in _ms.arg_info.ArgInfo.from_prim_func(func)[:-n_out]:
        shape = [int(d) for d in info.shape]
        dtype = str(info.dtype)
        value = (rng.standard_normal(shape).astype(dtype) if "float" in dtype
                 else rng.integers(0, 2, shape).astype(dtype))
        args.append(_tvm.runtime.tensor(value, dev))
    start = time.perf_counter()
    vm["main"](*args)  # warm-up (and a rough duration)
    if dev.dlpack_device_type() == _tvm.cuda().dlpack_device_type():
        # Launches are asynchronous and the first one loads the module: time a second,
        # synchronized call instead.
        dev.sync()
        start = time.perf_counter()
        vm["main"](*args)
        dev.sync()
    chain = time.perf_counter() - start < CHAIN_BELOW_S
    name, calls = ("chain", CHAIN) if chain else ("main", 1)
    if chain:
        vm[name](*args)  # the chain's own warm-up
    timer = vm.time_evaluator(name, dev, number=number, repeat=repeat,
                              min_repeat_ms=min_repeat_ms)
    return lambda: [float(s) / calls for s in timer(*args).results]


def _time_on(vm, func, n_out: int, dev, number: int, repeat: int,
             min_repeat_ms: int) -> list[float]:
    """``repeat`` samples of one kernel (:func:`_sampler`)."""
    try:
        return _sampler(vm, func, n_out, dev, number, repeat, min_repeat_ms)()
    except Exception as err:  # noqa: BLE001
        raise RuntimeError(f"run: {type(err).__name__}: {err}") from None


class _ThreadPool:
    """TVM's pool sized to the target's cores while timing, the caller's size restored after:
    the pool starts with a thread per CPU this process may run on, and the kernel was built
    for the target's cores and is timed on as many, as the model's build would run it."""

    def __init__(self, target_json: dict) -> None:
        import tvm as _tvm

        self.cores = int(_tvm.target.Target(target_json).attrs.get("num-cores", 0) or 0)
        self.pool = _tvm.get_global_func("runtime.config_threadpool")
        self.before = _tvm.get_global_func("runtime.NumThreads")()

    def __enter__(self) -> None:
        if self.cores:
            self.pool(1, self.cores)

    def __exit__(self, *_exc) -> None:
        if self.cores:
            self.pool(1, self.before)


def build_and_time(func_json: str, target_json: dict, number: int, repeat: int,
                   min_repeat_ms: int, n_out: int = 1) -> list[float]:
    """Compile one scheduled PrimFunc into VM programs calling it and time it here (runs in
    the worker process).

    Raises RuntimeError whose message starts with ``build:`` or ``run:``.
    """
    import tvm as _tvm
    from tvm import relax as _relax

    ex, func = _compile_kernel(func_json, target_json, n_out)
    dev = _tvm.cpu()
    with _ThreadPool(target_json):
        return _time_on(_relax.VirtualMachine(ex, dev), func, n_out, dev, number, repeat,
                        min_repeat_ms)


def build_and_time_together(funcs_json: list[str], target_json: dict, number: int,
                            repeat: int, min_repeat_ms: int, n_outs: list[int]
                            ) -> list[list[float]]:
    """Compile several scheduled PrimFuncs as :func:`build_and_time` does and time them side
    by side here: ``repeat`` rounds, each taking one sample of every kernel in turn
    (``measurement.timing.interleave``), so drift of the machine between rounds hits all of
    them alike. One list of seconds per kernel, in order.

    Raises RuntimeError whose message starts with ``build:`` or ``run:`` (naming the kernel).
    """
    import tvm as _tvm
    from tvm import relax as _relax

    from tvm_costfuse.measurement.timing import interleave

    dev = _tvm.cpu()
    built = []
    for i, (f, n) in enumerate(zip(funcs_json, n_outs, strict=True)):
        try:
            built.append(_compile_kernel(f, target_json, n))
        except RuntimeError as err:
            raise RuntimeError(f"build: kernel {i}: {err}") from None
    with _ThreadPool(target_json):
        samplers = {}
        for i, ((ex, func), n_out) in enumerate(zip(built, n_outs, strict=True)):
            try:
                one = _sampler(_relax.VirtualMachine(ex, dev), func, n_out, dev, number, 1,
                               min_repeat_ms)
            except Exception as err:  # noqa: BLE001
                raise RuntimeError(f"run: kernel {i}: {type(err).__name__}: {err}") from None
            # A sample runs the kernel for at least ``min_repeat_ms``: a kernel timed right
            # after a long one pays its cold first calls inside that window, not as the sample.
            samplers[i] = (lambda one=one: one()[0])
        try:
            samples = interleave(samplers, repeat)
        except Exception as err:  # noqa: BLE001
            raise RuntimeError(f"run: {type(err).__name__}: {err}") from None
    return [samples[i] for i in range(len(built))]


def build_and_time_rpc(func_json: str, target_json: dict, number: int, repeat: int,
                       min_repeat_ms: int, tracker: str, n_out: int = 1) -> list[float]:
    """Compile here, run on an RPC server that a tracker (``host:port:key``) hands out."""
    import os
    import tempfile

    from tvm import relax as _relax
    from tvm import rpc

    host, port, key = tracker.rsplit(":", 2)
    ex, func = _compile_kernel(func_json, target_json, n_out)
    try:
        session = rpc.connect_tracker(host, int(port)).request(key, session_timeout=120)
    except Exception as err:  # noqa: BLE001
        # The tracker's trouble, not the kernel's: "rpc:" makes it an environmental failure.
        raise RuntimeError(f"rpc: no RPC server for key {key!r} at {host}:{port}: {err}"
                           ) from None
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.so")
        ex.export_library(path)
        session.upload(path)
    dev = session.cpu()
    vm = _relax.VirtualMachine(session.load_module("kernel.so"), dev)
    return _time_on(vm, func, n_out, dev, number, repeat, min_repeat_ms)


def build_and_profile_cuda(func_json: str, target_json: dict, number: int, repeat: int,
                           min_repeat_ms: int, n_out: int = 1) -> dict:
    """Compile one scheduled PrimFunc for CUDA; ptxas resource usage always (``nvcc``), run
    times on a GPU when one is present (runs in the worker process).

    Returns ``{"run_secs", "ptxas": {"registers", "spill_bytes", "kernels"} or None}``, plus
    ``ptxas_error`` when nvcc is missing or failed (the kernel is timed all the same),
    ``not_timed`` and empty ``run_secs`` without a GPU, ``error`` and ``[1e10]`` when the run
    failed. Raises RuntimeError (``build: ...``) when it does not compile.
    """
    import tvm as _tvm
    from tvm import relax as _relax

    from tvm_costfuse.measurement.cuda_source import cuda_source
    from tvm_costfuse.measurement.registers import ptxas_report

    ex, func = _compile_kernel(func_json, target_json, n_out)
    arch = str(_tvm.target.Target(target_json).attrs.get("arch", "sm_90"))
    out: dict = {}
    try:
        # nvcc -O3 as compare does. TVM builds the kernel it runs itself (nvrtc, fast
        # math); whether its register allocation matches was not compared.
        report = ptxas_report(cuda_source(ex), arch)
        if not report:
            raise RuntimeError("nvcc reported no kernel")
        out["ptxas"] = {"registers": max(r.registers for r in report.values()),
                        "spill_bytes": sum(r.spill_store_bytes + r.spill_load_bytes
                                           for r in report.values()),
                        "kernels": len(report)}
    except Exception as err:  # noqa: BLE001 -- no nvcc, or nvcc rejected it: still time it
        out["ptxas"], out["ptxas_error"] = None, f"{type(err).__name__}: {err}"[:500]
    dev = _tvm.cuda()
    if not dev.exist:
        return {**out, "run_secs": [], "not_timed": "no GPU present"}
    try:
        out["run_secs"] = _time_on(_relax.VirtualMachine(ex, dev), func, n_out, dev, number,
                                   repeat, min_repeat_ms)
    except RuntimeError as err:  # a failed run keeps what ptxas said
        out["run_secs"], out["error"] = [1e10], str(err)
    return out


def _gpu_present() -> bool:
    return bool(tvm.cuda().exist)


@dataclass(frozen=True)
class RunnerKind:
    """How one target kind's kernels are timed: here, over RPC (None: not offered), and
    whether rows recorded untimed (compiled where no device was) can be timed now."""

    local: Callable
    rpc: Callable | None
    times_untimed: Callable[[], bool]


_RUNNER_KINDS = {
    "llvm": RunnerKind(build_and_time, build_and_time_rpc, lambda: False),
    "cuda": RunnerKind(build_and_profile_cuda, None, lambda: _gpu_present()),
}


def runner_kind(target: tvm.target.Target) -> RunnerKind:
    """The :class:`RunnerKind` of ``target``'s kind; ValueError for a kind with none."""
    kind = target.kind.name
    if kind not in _RUNNER_KINDS:
        raise ValueError(f"kernels are timed on {' and '.join(_RUNNER_KINDS)} targets, "
                         f"not {kind!r}")
    return _RUNNER_KINDS[kind]


class _Runner:
    """Calls the build-and-time function (CPU, RPC or CUDA) in a worker process with a
    timeout, or in-process."""

    def __init__(self, config: MeasureConfig, fn: Callable = build_and_time) -> None:
        self.config, self.fn, self.pool = config, fn, None
        if config.isolate:
            from tvm.support.popen_pool import PopenPoolExecutor

            self.pool = PopenPoolExecutor(max_workers=1, timeout=config.timeout_s)

    def __call__(self, func: tvm.tirx.PrimFunc, target: tvm.target.Target, n_out: int = 1
                 ) -> tuple[list[float], str | None, dict]:
        """(run seconds, error or None, what else the worker measured: ``ptxas`` on CUDA).
        The error is the full text (``database.failure_kind`` says whose fault it was)."""
        c = self.config
        args = (tvm.ir.save_json(func), target.export(), c.number, c.repeat, c.min_repeat_ms)
        if c.rpc_tracker is not None:
            args = (*args, c.rpc_tracker)
        args = (*args, n_out)
        try:
            out = self.call(*args)
        except TimeoutError:
            return [FAILED_RUN_SECS], f"timeout: build + run exceeded {c.timeout_s} s", {}
        except Exception as err:  # noqa: BLE001 -- worker crash, build or run error
            # The whole text: from a worker it is the traceback, the message on its last line.
            return [FAILED_RUN_SECS], str(err).strip() or type(err).__name__, {}
        if isinstance(out, dict):
            extra = {k: v for k, v in out.items() if k not in ("run_secs", "error")}
            return list(out["run_secs"]), out.get("error"), extra
        return out, None, {}

    def call(self, *args):
        """``fn(*args)`` in the worker (or in-process); raises what it raises, TimeoutError
        past the timeout."""
        return self.fn(*args) if self.pool is None else self.pool.submit(self.fn, *args).result()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
