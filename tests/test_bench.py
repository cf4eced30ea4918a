"""``costfuse bench``: our strategies next to PyTorch eager and ONNX Runtime on a user's model,
every column's output checked, one table. Timing figures are not asserted (benchmarks are
scripts); what is asserted is that every column ran and computed the model."""

from __future__ import annotations

import pytest
import torch
from test_export import _net_and_input

from tvm_costfuse.cli import main


def _row(out: str, name: str) -> dict:
    lines = [ln for ln in out.splitlines() if ln.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    row = next(ln for ln in lines if ln.startswith(f"| {name}"))
    return dict(zip(head, [c.strip() for c in row.strip("|").split("|")], strict=True))


def test_bench_a_pt2_beside_eager_ort_and_torch_compile(tmp_path, capsys) -> None:
    net, x = _net_and_input()
    path = tmp_path / "net.pt2"
    torch.export.save(torch.export.export(net, (x,)), str(path))
    assert main(["bench", str(path), "--repeat", "1", "--peers", "eager,ort,compile",
                 "--out", str(tmp_path / "t.md")]) == 0
    out = capsys.readouterr().out
    row = _row(out, "net.pt2")
    for column in ("none@1 ms", "tvm@1 ms", "costfuse@1 ms", "eager@1 ms", "ort@1 ms",
                   "compile@1 ms"):
        assert float(row[column]) > 0, (column, out)
    assert float(row["max err"]) < 1e-4  # every column, torch.compile's too
    assert int(row["k costfuse"]) <= int(row["k none"])
    for peer in ("eager", "ort", "compile"):
        assert f"speedup over {peer}" in out, out
    assert (tmp_path / "t.md").read_text().startswith("| model |")


class _TwoInputs(torch.nn.Module):
    def forward(self, a, b):
        return torch.relu(a @ b) + 1.0


def test_each_model_of_a_run_gets_its_own_onnx_export(tmp_path, capsys) -> None:
    """The ORT column of the second model once ran the first model's export (one file name
    in a folder shared by the run): ORT refused the inputs and the column went missing."""
    net, x = _net_and_input()
    first, second = tmp_path / "net.pt2", tmp_path / "two.pt2"
    torch.export.save(torch.export.export(net, (x,)), str(first))
    a, b = torch.randn(4, 8), torch.randn(8, 5)
    torch.export.save(torch.export.export(_TwoInputs(), (a, b)), str(second))
    assert main(["bench", str(first), str(second), "--repeat", "1", "--strategies", "costfuse",
                 "--peers", "ort"]) == 0
    out = capsys.readouterr().out
    for name in ("net.pt2", "two.pt2"):
        assert float(_row(out, name)["ort@1 ms"]) > 0, out
    assert "no ort column" not in out


def test_bench_without_a_pytorch_form_says_so_and_plots(tmp_path, capsys) -> None:
    import matplotlib.image

    plot = tmp_path / "bench.png"
    assert main(["bench", "mlp_gelu", "--small", "--repeat", "1", "--peers", "eager",
                 "--strategies", "tvm,costfuse", "--plot", str(plot), "--huge-pages"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "no eager column: no PyTorch form" in out
    assert "mlp_gelu @1: huge pages: " in out and "--huge-pages" in out  # what moved, or why not
    assert float(_row(out, "mlp_gelu")["costfuse@1 ms"]) > 0
    height, width, _ = matplotlib.image.imread(plot).shape  # a PNG that decodes
    assert height > 100 and width > 100
    assert "bench mlp_gelu" in captured.err and "1/1" in captured.err  # the progress bar


def test_a_wrong_column_is_marked_and_left_out_of_the_geomeans() -> None:
    from tvm_costfuse.report.bench import speedup, table

    row = {"model": "m", "family": "f", "kernels": {"tvm": 3, "costfuse": 2},
           "ms": {"tvm@1": 2.0, "costfuse@1": 1.0, "ort@1": 4.0},
           "err": {"tvm@1": 1e-7, "costfuse@1": 1e-7, "ort@1": 0.5},
           "failed": {}, "other_load": {"1": 0.0}}
    text = table([row], [1], ("tvm", "costfuse"), ("ort",))
    assert "WRONG 4" in text and "ort@1 is WRONG" in text
    assert "speedup over tvm: geomean 2.00x" in text and "speedup over ort" not in text
    assert speedup(row, "costfuse", "tvm", 1) == 2.0 and speedup(row, "costfuse", "ort", 1) is None


def test_the_machine_idles_before_a_sample_that_follows_another_runtime(monkeypatch) -> None:
    """A runtime's pool spins after its call; at 2 threads on 2 cores the next column shared
    its cores with it (ONNX Runtime's decode steps read 2-3x slow): pause at each switch."""
    from tvm_costfuse.measurement import timing

    order: list[str] = []
    monkeypatch.setattr(timing.time, "sleep", lambda s: order.append(f"sleep {s}"))

    def sampler(name: str):
        return lambda: order.append(name) or 1.0

    samplers = {"none@2": sampler("none"), "costfuse@2": sampler("costfuse"),
                "eager@2": sampler("eager"), "ort@2": sampler("ort")}
    runtime = {"none@2": "tvm", "costfuse@2": "tvm", "eager@2": "torch", "ort@2": "ort"}
    samples = timing.interleave(samplers, 2, 0.3, runtime.get)
    assert samples == {k: [1.0, 1.0] for k in samplers}
    assert order == ["sleep 0.3", "none", "costfuse", "sleep 0.3", "eager", "sleep 0.3", "ort"] * 2
    order.clear()
    timing.interleave(samplers, 1)  # no runtime named: back to back, as our own A/B runs
    assert order == ["none", "costfuse", "eager", "ort"]


def test_samples_taken_with_the_cpus_apart_are_named() -> None:
    """A thread-pool launch far over the run's fastest (the vCPUs on cores without a shared
    cache, ``measurement/placement.py``): the row says how many of its samples were so."""
    from tvm_costfuse.report.bench import table

    def row(name, probes):
        return {"model": name, "family": "f", "kernels": {"tvm": 3, "costfuse": 2},
                "ms": {"tvm@2": 2.0, "costfuse@2": 1.0}, "err": {"tvm@2": 0.0, "costfuse@2": 0.0},
                "failed": {}, "other_load": {"2": 0.0}, "probe_s": {"2": probes}}

    older = row("older", [])
    del older["probe_s"]  # a row written before the probe
    rows = [row("near", [0.9e-6, 1.1e-6]), row("far", [1.0e-6, 1.8e-6, 1.75e-6]),
            row("slow", [1.3e-6, 1.3e-6]),  # apart only against the other rows' fastest
            {"model": "broken", "threads": 2, "error": "ValueError: no"}, older]
    text = table(rows, [2], ("tvm", "costfuse"), ())
    assert "apart 2/3 @2" in _row(text, "far")["other load"]
    assert "apart 2/2 @2" in _row(text, "slow")["other load"]
    assert "apart" not in _row(text, "near")["other load"]
    assert "apart" not in _row(text, "older")["other load"]
    note = next(ln for ln in text.splitlines() if ln.startswith("- apart (samples of ours"))
    assert note.endswith(": far, slow")


def test_each_sample_of_ours_at_two_threads_is_probed(monkeypatch, tmp_path) -> None:
    """One probe per sample of our columns at 2 threads, none at 1; the row stays JSON."""
    import json

    from tvm_costfuse.measurement.placement import LaunchProbe
    from tvm_costfuse.report import bench as bench_mod

    made = []

    class _Probe:
        def __init__(self, threads):
            made.append(threads)

        def __call__(self):
            return 1e-6

    monkeypatch.setattr(bench_mod, "launch_probe", _Probe)
    row = bench_mod.bench(bench_mod.workload("mlp_gelu", small=True), [1, 2], repeat=2,
                          tmp=str(tmp_path), ours=("tvm", "costfuse"), peers=())
    assert made == [2]
    assert row["probe_s"] == {"2": [1e-6] * 4}  # 2 rounds x 2 columns
    assert "left_out" not in row
    json.dumps(row)
    seconds = LaunchProbe(2)()  # the real probe builds and times a parallel launch
    assert 0 < seconds < 1e-3


def test_bench_leaves_out_rounds_taken_apart(monkeypatch, tmp_path) -> None:
    """A round in which a probe before a sample of ours read apart is left out of every
    column, peers' too (a stretch apart slows the columns unlike each other); the row and
    the table say how many; the kept rounds' probes stay for the table's run-wide check."""
    from tvm_costfuse.report import bench as bench_mod

    # probes in the order taken: round 0 near, round 1 apart (tvm's sample), round 2 near
    readings = iter([1e-6, 1e-6, 2e-6, 1e-6, 1e-6, 1.1e-6])
    seconds = {"tvm@2": iter([1.0, 5.0, 1.2]), "costfuse@2": iter([0.9, 4.0, 1.1]),
               "eager@2": iter([3.0, 9.0, 3.4])}

    def interleave(samplers, repeat, *_args):
        out = {k: [] for k in samplers}
        for _ in range(repeat):
            for k, sample in samplers.items():
                sample()
                out[k].append(next(seconds[k]))
        return out

    monkeypatch.setattr(bench_mod, "launch_probe", lambda _t: lambda: next(readings))
    monkeypatch.setattr(bench_mod, "interleave", interleave)
    monkeypatch.setattr(bench_mod, "eager_sampler", lambda _call, _t: lambda: 0.0)
    monkeypatch.setattr(bench_mod, "vm_sampler", lambda *_a, **_k: lambda: 0.0)
    w = bench_mod.workload("mlp_gelu", small=True)
    assert w.eager is None  # no PyTorch form: stand one in that returns the reference
    ref = bench_mod.run(bench_mod.tvm.compile(
        w.mod, target=bench_mod.host_target(),
        relax_pipeline=bench_mod.strategy_pipeline("none", bench_mod.host_target())),
        w.inputs)[0]
    w.eager = lambda: ref
    row = bench_mod.bench(w, [2], repeat=3, tmp=str(tmp_path), ours=("tvm", "costfuse"),
                          peers=("eager",))
    assert row["left_out"] == {"2": 1}
    assert row["ms"] == {"tvm@2": pytest.approx(1.1e3), "costfuse@2": pytest.approx(1.0e3),
                         "eager@2": pytest.approx(3.2e3)}
    assert row["probe_s"] == {"2": [1e-6, 1e-6, 1e-6, 1.1e-6]}
    text = bench_mod.table([row], [2], ("tvm", "costfuse"), ("eager",))
    assert "left out 1 round(s) @2" in _row(text, "mlp_gelu")["other load"]
    assert any(ln.startswith("- left out (whole rounds") and ln.endswith(": mlp_gelu")
               for ln in text.splitlines())


def test_build_timings_leave_out_rounds_taken_apart(monkeypatch) -> None:
    """``time_builds`` probes before each sample at 2 threads and leaves out the rounds in
    which any sample's probe read apart, for every build alike (a stretch apart slows some
    plans more than others); at 1 thread nothing is probed. Where every round read apart,
    all are kept: nothing near tells it."""
    from tvm_costfuse.measurement import peers, placement

    # Per build: (sample seconds, probe seconds before it), in the order they are taken.
    plan = {"a#0": [(1.0, 1e-6), (9.0, 2e-6), (1.2, 1e-6)],
            "b#0": [(2.0, 1e-6), (2.2, 1e-6), (2.4, 1e-6)]}
    next_probe: list[float] = []

    class _Probe:
        def __init__(self, threads):
            assert threads == 2

        def __call__(self):
            return next_probe.pop(0)

    def sampler(key):
        taken = iter(plan[key])
        return lambda: next(taken)[0]

    def interleave(samplers, repeat):
        out = {k: [] for k in samplers}
        for r in range(repeat):
            for k, s in samplers.items():
                next_probe.append(plan[k][r][1])
                out[k].append(s())
        return out

    builds = {"a": ["a"], "b": ["b"]}
    monkeypatch.setattr(peers, "launch_probe", _Probe)
    monkeypatch.setattr(peers, "vm_sampler", lambda ex, _inputs: sampler(f"{ex}#0"))
    monkeypatch.setattr(peers, "with_threads", lambda s, _t: s)
    monkeypatch.setattr(peers, "interleave", interleave)
    dropped: list[int] = []
    ms, _ = peers.time_builds(builds, {}, 2, 3, dropped)
    assert dropped == [2]  # round 2 of both builds: a's probe 2x the fastest
    assert ms["a"] == [pytest.approx(1.1e3)] and ms["b"] == [pytest.approx(2.2e3)]
    next_probe.clear()
    ms, _ = peers.time_builds(builds, {}, 1, 3, dropped)
    assert dropped == [2, 0] and ms["a"] == [pytest.approx(1.2e3)]  # 1 thread: no probe
    # every round apart against nothing faster, or nothing probed: every sample kept
    same = {"a#0": [1.0, 2.0], "b#0": [3.0, 4.0]}
    assert placement.near_rounds(same, {"a#0": [2e-6, 2e-6], "b#0": [2e-6, 2e-6]}) == (same, 0)
    assert placement.near_rounds(same, {}) == (same, 0)
    with pytest.raises(ValueError, match="probes for"):
        placement.near_rounds(same, {"a#0": [1e-6]})
