"""``costfuse compile``: a user's .onnx or .pt2 becomes a library that a plain TVM program
(no CostFuse imported) loads and runs with the model's numerics."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from tvm_costfuse.cli import main
from tvm_costfuse.export import compile_model, parse_config

# A program that knows nothing of CostFuse: load the library, run it, save the output.
PLAIN_TVM = textwrap.dedent("""
    import sys, numpy as np, tvm
    from tvm import relax
    lib = tvm.runtime.load_module(sys.argv[1])
    vm = relax.VirtualMachine(lib, tvm.cpu())
    x = np.load(sys.argv[2])
    out = vm["main"](tvm.runtime.tensor(x))
    np.save(sys.argv[3], out.numpy())
    assert "tvm_costfuse" not in sys.modules
""")


class _Net(torch.nn.Module):
    """Conv + BN + ReLU, a depthwise conv, pooling and a linear head: a small CNN."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.nn.functional.relu6(self.dw(y))
        return torch.softmax(self.fc(y.mean((2, 3))), dim=-1)


def _net_and_input():
    torch.manual_seed(0)
    net = _Net().eval()
    with torch.no_grad():  # non-trivial running statistics
        net.bn.running_mean.uniform_(-0.5, 0.5)
        net.bn.running_var.uniform_(0.5, 2.0)
    return net, torch.randn(1, 3, 9, 9)


def _plain_run(library, x: np.ndarray, tmp_path) -> np.ndarray:
    np.save(tmp_path / "x.npy", x)
    subprocess.run([sys.executable, "-c", PLAIN_TVM, str(library), str(tmp_path / "x.npy"),
                    str(tmp_path / "out.npy")], check=True, timeout=300)
    return np.load(tmp_path / "out.npy")


def test_a_pt2_compiles_to_a_library_plain_tvm_runs(tmp_path) -> None:
    net, x = _net_and_input()
    path = tmp_path / "net.pt2"
    torch.export.save(torch.export.export(net, (x,)), str(path))
    library = tmp_path / "net.so"
    assert main(["compile", str(path), "-o", str(library), "--report",
                 str(tmp_path / "plan.json")]) == 0
    with torch.no_grad():
        want = net(x).numpy()
    np.testing.assert_allclose(_plain_run(library, x.numpy(), tmp_path), want, rtol=1e-4,
                               atol=1e-6)
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["groups"] and all("predicted_s" in g for g in plan["groups"])


def test_an_onnx_compiles_to_a_library_plain_tvm_runs(tmp_path) -> None:
    net, x = _net_and_input()
    path = tmp_path / "net.onnx"
    torch.onnx.export(net, (x,), str(path), input_names=["x"], dynamo=False)
    for strategy in ("costfuse", "tvm"):
        library = tmp_path / f"net-{strategy}.so"
        summary = compile_model(str(path), str(library), strategy=strategy, verify=True)
        assert summary["kernels"] >= 1 and summary["max_error"] <= 1e-4
        with torch.no_grad():
            want = net(x).numpy()
        np.testing.assert_allclose(_plain_run(library, x.numpy(), tmp_path), want,
                                   rtol=1e-4, atol=1e-6)


def test_config_keys_are_fusion_config_fields() -> None:
    assert parse_config(["max_chain_length=8", "costfuse.search=exact"]) == {
        "max_chain_length": 8, "search": "exact"}
    with pytest.raises(ValueError, match="unknown config key 'chain'"):
        parse_config(["chain=8"])
    with pytest.raises(ValueError, match="takes an integer"):
        parse_config(["max_body_ops=many"])
    with pytest.raises(ValueError, match="key=value"):
        parse_config(["max_body_ops"])


def test_compile_names_a_bad_request(tmp_path, capsys) -> None:
    assert main(["compile", "mlp_gelu", "-o", str(tmp_path / "m.so"), "--strategy",
                 "fastest"]) == 2
    assert "unknown strategy 'fastest'" in capsys.readouterr().err
    assert main(["compile", "mlp_gelu", "-o", str(tmp_path / "m.so"), "--strategy", "tvm",
                 "--config", "max_body_ops=4"]) == 2
    assert "--config applies to the costfuse strategies" in capsys.readouterr().err


def test_a_target_this_cpu_may_not_run_is_built_not_run(tmp_path, capsys) -> None:
    """AVX-512 code on an AVX2 host dies of SIGILL: another mcpu is built, never run, and
    --verify (which runs it) is refused before anything is built."""
    from tvm_costfuse.targets import host_target

    other = "haswell" if host_target().attrs.get("mcpu") != "haswell" else "skylake-avx512"
    library = tmp_path / "m.so"
    assert main(["compile", "mlp_gelu", "-o", str(library), "--target",
                 f"llvm -mcpu={other}", "--verify"]) == 2
    assert "--verify runs the library here" in capsys.readouterr().err
    assert not library.exists()
    assert main(["compile", "mlp_gelu", "-o", str(library), "--target",
                 f"llvm -mcpu={other}"]) == 0
    assert library.exists() and "not run here" in capsys.readouterr().err
    assert main(["compile", "mlp_gelu", "-o", str(library), "--strategy",
                 "costfuse-bogus"]) == 2
    assert "unknown strategy 'costfuse-bogus'" in capsys.readouterr().err
