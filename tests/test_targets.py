"""Target descriptions: GPU presets, the host from /sys and LLVM, and the quick calibration."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import tvm
from conftest import QuietLoad

from tvm_costfuse import targets
from tvm_costfuse.measurement import calibrate
from tvm_costfuse.targets import A100, H100, H200, machine


# ---------------------------------------------------------------------------- GPU presets
def test_gpu_presets_relations():
    assert H200.dram_bw > H100.dram_bw > A100.dram_bw
    assert H100.peak("float32") == H200.peak("float32") > A100.peak("float32")
    for gpu in (H100, H200, A100):
        assert gpu.kind == "cuda" and gpu.source == "datasheet"
        assert gpu.peak("float16") == gpu.peak("bfloat16") > 10 * gpu.peak("float32")
        assert (gpu.regs_per_sm, gpu.regs_per_thread, gpu.max_threads_per_sm) == (65536, 255, 2048)
        assert gpu.warp_size == 32 and gpu.max_threads_per_block == 1024
        assert gpu.launch_s_graph < gpu.launch_s
        assert gpu.l2_bw > gpu.dram_bw and gpu.l1_bw > gpu.l2_bw
    assert [g.sm_count for g in (H100, H200, A100)] == [132, 132, 108]
    assert (H100.l2_bytes, A100.l2_bytes) == (50 << 20, 40 << 20)


@pytest.mark.parametrize("desc, arch", [(H100, "sm_90"), (H200, "sm_90"), (A100, "sm_80")])
def test_gpu_tvm_target(desc, arch):
    target = desc.tvm_target()
    assert target.kind.name == "cuda" and target.attrs["arch"] == arch
    assert int(target.attrs["registers_per_block"]) == 65536
    assert int(target.attrs["l2_cache_size_bytes"]) == desc.l2_bytes


def test_desc_is_frozen_and_hashable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        H100.dram_bw = 1.0
    with pytest.raises(TypeError):
        H100.peak_flops["float32"] = 1.0
    assert len({H100, H200, A100, H100.replace()}) == 3
    assert H100.peak("int8") == H100.peak("float32")  # no figure: float32's


def test_preset_lookup():
    assert targets.preset("H100") is H100 and targets.preset(" a100 ") is A100
    assert targets.preset("Host").kind == "cpu"
    with pytest.raises(ValueError, match="unknown target 'nope'.*h100, h200, a100, host"):
        targets.preset("nope")


# ---------------------------------------------------------------------------- the host
def _sysfs_cache(level: int) -> int | None:
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        if int((index / "level").read_text()) == level and (
            (index / "type").read_text().strip() != "Instruction"
        ):
            return machine._parse_size((index / "size").read_text())
    return None


def test_host_matches_this_machine():
    desc = targets.host(calibration=False)
    assert desc.kind == "cpu" and desc.source.endswith("+default")
    assert desc.cores == len(os.sched_getaffinity(0)) == desc.parallel_units
    assert desc.arch == tvm.target.codegen.llvm_get_system_cpu() != "native"
    for level, size in ((1, desc.l1_bytes), (2, desc.l2_bytes), (3, desc.l3_bytes)):
        if _sysfs_cache(level) is not None:
            assert size == _sysfs_cache(level)
            assert desc.source.startswith("sysfs")
    # The host description against this host's own flags: the same check on any x86-64 host.
    flags = Path("/proc/cpuinfo").read_text()
    want = 512 if " avx512f" in flags else 256 if " avx2" in flags else 128
    assert desc.vector_bits == want and desc.vector_regs == (32 if want == 512 else 16)
    target = desc.tvm_target()
    assert target.kind.name == "llvm" and target.attrs["mcpu"] == desc.arch
    assert int(target.attrs["num-cores"]) == desc.cores


def test_parse_size():
    assert machine._parse_size("32K\n") == 32 << 10
    assert machine._parse_size("32 M") == 32 << 20
    assert machine._parse_size("1024") == 1024


def test_for_target():
    assert targets.for_target({"kind": "cuda", "arch": "sm_90"}) is H100
    assert targets.for_target("nvidia/nvidia-h100") is H100  # sm_90a
    assert targets.for_target({"kind": "cuda", "arch": "sm_80"}) is A100
    assert targets.for_target({"kind": "cuda", "arch": "sm_90"}, gpu="h200") is H200
    with pytest.raises(ValueError, match="sm_70"):
        targets.for_target({"kind": "cuda", "arch": "sm_70"})
    host = targets.for_target({"kind": "llvm", "mcpu": targets.host_cpu(), "num-cores": 1})
    assert host.kind == "cpu" and host.cores == 1
    assert targets.for_target("llvm").cores == len(os.sched_getaffinity(0))


# ---------------------------------------------------------------------------- calibration
@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    path = tmp_path_factory.mktemp("cal") / "host_calibration.json"
    return calibrate.calibrate(quick=True, path=path), path


def test_quick_calibration_is_physical(calibrated):
    desc, _ = calibrated
    assert desc.source.endswith("+calibrated")
    figures = {"dram_bw": desc.dram_bw, "flops": desc.peak("float32"), "launch": desc.launch_s}
    assert all(math.isfinite(v) and v > 0 for v in figures.values()), figures
    assert 0.5e9 <= desc.dram_bw <= 500e9, figures
    assert 1e8 <= desc.peak("float32") <= 1e13, figures
    assert 1e-8 <= desc.launch_s <= 1e-2, figures
    assert desc.l2_bw > 0.5e9
    # One vectorized exp per core: 0.25 ns, 29 FLOPs of the FMA peak with AVX-512 code (53 with
    # AVX2, 122 with SSE2) on a quiet znver4. The two are timed at different moments, and the
    # suite's other worker may load either: bounds wide enough for a busy 2-core host.
    per_core_peak = desc.peak("float32") / desc.cores
    assert desc.math_s is not None and desc.exp_seconds() == desc.math_s
    flops_per_exp = desc.math_s * per_core_peak
    assert 1e-11 <= desc.math_s <= 1e-7, desc.math_s
    assert flops_per_exp >= 1.0, flops_per_exp
    assert flops_per_exp <= 3000.0, flops_per_exp
    # The depthwise kernels' shares of the peak over their K term: 0.10-1.1 on two quiet
    # hosts; wide bounds, for a busy 2-core host and hosts not seen.
    assert desc.depthwise_shares is not None and len(desc.depthwise_shares) == 4
    assert all(0.005 <= s <= 5.0 for s in desc.depthwise_shares), desc.depthwise_shares
    # A gathered transpose element: 1.3-1.5 ns a core on a quiet rocketlake host.
    assert desc.gather_s is not None and 1e-11 <= desc.gather_s <= 1e-7, desc.gather_s
    assert desc.gather_seconds() == desc.gather_s
    # A lone tiled transpose element: 0.14-0.16 ns a core on a quiet rocketlake host.
    assert desc.transpose_s is not None and 1e-12 <= desc.transpose_s <= 1e-7, desc.transpose_s
    assert desc.transpose_seconds() == desc.transpose_s


def test_math_kernel_computes_exp_in_its_polynomial():
    """The calibration's exp sweep computes exp (``fast_math``'s polynomial, not a libm call)
    and its control sweep the multiply-add it says."""
    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    x0 = np.linspace(-3.0, 3.0, 64, dtype="float32")
    want = {True: np.exp(-np.exp(-x0.astype("float64"))), False: 0.5 - 0.5 * (0.5 - 0.5 * x0)}
    for exp, expect in want.items():
        func = calibrate._math_kernel(32, 4, 2, 2, exp)
        if exp:
            assert "exp" not in str(func.body)  # rewritten into the polynomial
        ex = tvm.compile(tvm.IRModule({"math": func.with_attr("global_symbol", "math")}),
                         target=target)
        x = tvm.runtime.tensor(x0.copy())
        ex["math"](x)
        np.testing.assert_allclose(x.numpy(), expect, rtol=2e-6, atol=1e-7)


def test_exp_seconds_where_a_record_has_no_math_s():
    """A record from before ``math_s`` prices an exp at ``EXP_FLOPS`` of the per-core peak;
    GPU presets keep math free; a measured ``math_s`` is used as it stands."""
    from tvm_costfuse.targets.desc import EXP_FLOPS

    record = {"cpu": targets.host_cpu(), "cpu_model": targets.host_cpu_model(), "num_cores": 2,
              "quick": True, "figures": {"dram_bw": 1e10, "fp32_flops": 2e11, "launch_s": 1e-6,
                                         "launch_s_serial": 1e-7}}
    old = targets.host(num_cores=2, calibration=record)
    assert old.source.endswith("+calibrated") and old.math_s is None
    assert old.exp_seconds() == pytest.approx(EXP_FLOPS / 1e11)
    assert old.depthwise_shares is None  # nor the depthwise shares: efficiency.py's fitted
    assert old.gather_s is None and old.gather_seconds() == pytest.approx(32.0 / (1e10 / 2))
    assert old.transpose_s is None and old.transpose_seconds() == pytest.approx(2.0 / (1e10 / 2))
    record["figures"]["math_s"] = 3e-10
    assert targets.host(num_cores=2, calibration=record).exp_seconds() == 3e-10
    shares = {"depthwise_s1": 0.3, "depthwise_s2": 0.1, "channels_last_s1": 0.8,
              "channels_last_s2": 0.4}
    record["figures"] |= shares
    assert targets.host(num_cores=2, calibration=record).depthwise_shares == (0.3, 0.1, 0.8, 0.4)
    assert targets.H100.exp_seconds() == 0.0


def test_calibration_round_trip(calibrated):
    desc, path = calibrated
    record = calibrate.load(path)
    assert record["cpu"] == targets.host_cpu() and record["quick"] is True
    assert "date" in record and record["num_cores"] == desc.cores
    assert targets.host(num_cores=desc.cores, calibration=path) == desc
    # A record from another CPU is ignored: back to the documented defaults.
    other = path.with_name("other.json")
    other.write_text(json.dumps(record | {"cpu": "not-this-cpu"}))
    assert calibrate.load(other) is None
    assert targets.host(num_cores=desc.cores, calibration=other).source.endswith("+default")
    assert calibrate.load(path.with_name("absent.json")) is None


def test_first_use_measures_once_and_caches_per_cpu_and_cores(tmp_path, monkeypatch):
    """Without a record for this CPU and core count, pricing measures one (quick mode), says
    so, caches it, and the next process reads it; a disturbed measurement is not cached."""
    from tvm_costfuse.targets import calibration

    measured = []

    def fake_measure(num_cores, quick):
        measured.append((num_cores, quick))
        return {"cpu": targets.host_cpu(), "cpu_model": targets.host_cpu_model(),
                "num_cores": num_cores, "quick": quick,
                "figures": {"dram_bw": 12.5e9, "fp32_flops": 3e11, "launch_s": 4e-6,
                            "launch_s_serial": 1e-7, "l2_bw": 9e10, "l3_bw": 4e10}}

    path = tmp_path / "cal.json"
    monkeypatch.setattr(calibration, "CALIBRATION_PATH", path)
    monkeypatch.setattr(calibration, "_measured", {})
    monkeypatch.setattr(calibrate, "measure", fake_measure)
    # Other test workers (xdist) or any job on the host must not decide what is cached.
    monkeypatch.setattr(calibrate, "OtherLoad", QuietLoad)
    one = targets.host(num_cores=1)
    assert one.source.endswith("+calibrated") and one.dram_bw == 12.5e9
    assert measured == [(1, True)] and calibration.load_calibration(path, 1)["num_cores"] == 1
    two = targets.host(num_cores=2)
    assert two.source.endswith("+calibrated") and measured == [(1, True), (2, True)]
    # Another process (nothing measured in it yet) reads both records back, measuring nothing.
    monkeypatch.setattr(calibration, "_measured", {})
    assert targets.host(num_cores=1) == one and targets.host(num_cores=2) == two
    assert len(measured) == 2
    # A measurement taken while others kept the machine busy prices this process only.
    monkeypatch.setattr(calibration, "DISTURBED_CORES", -1.0)
    assert targets.host(num_cores=3).source.endswith("+calibrated") and len(measured) == 3
    assert calibration.load_calibration(path, 3) is None


def test_calibration_off_measures_nothing(monkeypatch):
    from tvm_costfuse.targets import calibration

    monkeypatch.setattr(calibration, "_measured", {})
    monkeypatch.setattr(calibrate, "measure", lambda *a: pytest.fail("measured"))
    assert str(calibration.CALIBRATION_PATH) == "none"  # what conftest sets for the suite
    assert targets.host(num_cores=1).source.endswith("+default")


def test_pipeline_takes_every_name_resolve_takes() -> None:
    """``pipeline("h100")`` went through ``tvm.target.Target("h100")`` (no such tag) where
    ``CostFuse(target="h100")`` worked: every public entry resolves targets one way."""
    import tvm_costfuse
    from tvm_costfuse import models
    from tvm_costfuse.measurement.cuda_source import kernel_sources
    from tvm_costfuse.targets import resolve

    mod, _ = models.load("mlp_gelu", small=True)
    target = resolve("h100").tvm
    with target:
        ex = tvm.compile(mod, target=target, relax_pipeline=tvm_costfuse.pipeline("h100"))
    assert kernel_sources(ex)
    # the strategies' pipelines and the pre-fusion passes take the same names
    for strategy in ("costfuse", "tvm", "none"):
        with target:
            ex = tvm.compile(mod, target=target,
                             relax_pipeline=tvm_costfuse.strategy_pipeline(strategy, "h100"))
        assert kernel_sources(ex), strategy
    assert tvm_costfuse.pipelines.prepare(mod, "h200") is not None


def test_a_preset_keeps_its_description_where_its_arch_names_another(monkeypatch) -> None:
    """h200 and h100 share sm_90: a pipeline for "h200" prices plans as an H200, not as the
    H100 its arch alone would name; a plain "llvm" keeps TVM's generic x86-64."""
    from tvm_costfuse import strategies
    from tvm_costfuse.targets import compile_target, preset, resolve

    priced = []
    real = strategies.fusion_pass
    monkeypatch.setattr(strategies, "fusion_pass",
                        lambda s, t, **c: priced.append(resolve(t).desc.name) or real(s, t, **c))
    for spec in ("h200", preset("h200"), resolve("h200")):
        strategies.strategy_pipeline("costfuse", spec)
    assert priced == ["h200"] * 3
    # a plain "llvm" is scheduled and priced for what tvm.compile(target="llvm") builds
    from tvm_costfuse.targets import for_pipeline

    generic = for_pipeline("llvm")
    assert "mcpu" not in generic.tvm.attrs and generic.desc.arch == "x86-64"
    assert for_pipeline("host").desc.arch == resolve("host").desc.arch

    assert resolve("h200").desc.name == "h200" and resolve("h100").desc.name == "h100"
    assert str(compile_target("h200")) == str(resolve("h200").tvm)
    assert "mcpu" not in compile_target("llvm").attrs
    assert str(compile_target("host")) == str(resolve("host").tvm)


def test_target_strings_as_tvm_users_write_them():
    """TVM 0.27's Target takes only the dict form; the resolver reads the tvmc string form."""
    from tvm_costfuse.targets import resolve

    cpu = resolve("llvm -mcpu=skylake-avx512 -num-cores=2 -mattr=+avx512f,+fma").tvm
    assert cpu.kind.name == "llvm" and cpu.attrs["mcpu"] == "skylake-avx512"
    assert int(cpu.attrs["num-cores"]) == 2 and list(cpu.attrs["mattr"]) == ["+avx512f", "+fma"]
    gpu = resolve("cuda -arch=sm_80")
    assert gpu.tvm.attrs["arch"] == "sm_80" and gpu.desc.name == "a100"
    with pytest.raises(ValueError, match="such as 'llvm -mcpu=znver3'"):
        resolve("llvm -mcpu")


def test_a_description_names_its_records_folder_as_its_compile_target_does() -> None:
    """The learned model finds its records by the description's ``key``; the feedback loop
    writes them under the compile target's: one name for both, without a round trip."""
    from tvm_costfuse.records.database import default_work_dir, target_key
    from tvm_costfuse.targets import host, preset

    for desc in (preset("h100"), preset("h200"), preset("a100"), host(2, mcpu="skylake-avx512")):
        assert desc.key == target_key(desc.tvm_target())
        assert default_work_dir(desc) == default_work_dir(desc.tvm_target())
    assert preset("h100").key == preset("h200").key == "cuda-sm_90"
