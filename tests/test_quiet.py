"""``measurement.quiet``: other processes' CPU use during a timed window is seen, in cores."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

from tvm_costfuse.measurement.quiet import OtherLoad


def test_a_busy_process_elsewhere_is_counted():
    spin = "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass"
    proc = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.2)  # the interpreter's start-up is not the window
        with OtherLoad() as load:
            time.sleep(1.0)
    finally:
        proc.wait()
    assert load.cores >= 0.5  # one spinning core (more if another test runs meanwhile)


def test_own_threads_are_not_counted():
    with OtherLoad() as load:
        end = time.perf_counter() + 0.5
        while time.perf_counter() < end:
            pass
    assert load.own_cores >= 0.8 and math.isfinite(load.cores) and load.cores >= 0.0
    # The machine can be no busier than all its CPUs; ours, spinning, is not "other".
    assert load.cores <= os.cpu_count() - 0.8  # /proc/stat counts every CPU
