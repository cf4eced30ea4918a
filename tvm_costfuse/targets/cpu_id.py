"""Which CPU this is: LLVM's name for it and its model string. The host's description and its
calibration records are keyed by both (one LLVM name covers several models and core counts)."""

from __future__ import annotations

from pathlib import Path

import tvm


def host_cpu() -> str:
    """LLVM's name for this CPU (``mcpu="native"`` silently means generic SSE2 in TVM 0.27)."""
    return str(tvm.target.codegen.llvm_get_system_cpu())


def host_cpu_model() -> str:
    """The ``model name`` line of /proc/cpuinfo ("" when absent)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
