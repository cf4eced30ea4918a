"""``measurement.quiet``: other processes' CPU use during a timed window is seen, in cores,
and this process' own is not counted. Both hold however busy the test machine is."""

from __future__ import annotations

import resource
import subprocess
import sys
import time

import pytest

from tvm_costfuse.measurement import quiet
from tvm_costfuse.measurement.quiet import OtherLoad

# Burns 0.3 s of its own CPU time (however long that takes on a loaded machine), then exits.
_BURN = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"


def test_a_busy_process_elsewhere_is_counted():
    def children_cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    before = children_cpu()
    with OtherLoad() as load:  # the child lives and dies inside the window
        subprocess.run([sys.executable, "-c", _BURN], check=True)
    child_cpu = children_cpu() - before
    assert child_cpu >= 0.3
    assert load.cores * load.seconds >= child_cpu - 0.05  # 10 ms clock ticks, twice


def test_own_threads_are_not_counted(monkeypatch):
    busy = iter([100.0, 103.0])  # every CPU's busy seconds at the window's start and end
    own = iter([10.0, 11.5])  # this process' CPU seconds
    monkeypatch.setattr(quiet, "_busy_seconds", lambda: next(busy))
    monkeypatch.setattr(quiet, "_own_seconds", lambda: next(own))
    with OtherLoad() as load:
        time.sleep(0.05)
    assert load.own_cores * load.seconds == pytest.approx(1.5)
    assert load.cores * load.seconds == pytest.approx(3.0 - 1.5)
