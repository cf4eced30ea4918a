"""How busy the rest of the machine was while we timed: the CPU that other processes (and the
hypervisor, as steal time) took, in cores.

Interleaved rounds make a shared machine's drift hit every column alike, but they do not make a
figure clean: on a 2-vCPU host, other work during a corpus run (a package install, a short
script) doubled a 2-thread model's time and made a 1-thread one 70% slower. A benchmark row records this figure so that a disturbed row is
seen as one (and rerun) instead of being read as a result. Linux only (``/proc/stat``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Self

# /proc/stat's cpu line: user nice system idle iowait irq softirq steal ...; idle and iowait
# are the only states in which a CPU did nothing for anyone.
_IDLE_FIELDS = (3, 4)


def _busy_seconds() -> float | None:
    """CPU seconds every process (and steal) has used since boot, or None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    busy = sum(v for i, v in enumerate(fields) if i not in _IDLE_FIELDS)
    return busy / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    t = os.times()  # every thread of this process: TVM's pool, PyTorch's and ORT's threads
    return t.user + t.system


@dataclass
class OtherLoad:
    """``with OtherLoad() as load: ...``, then ``load.cores``: the average number of cores
    something other than this process kept busy meanwhile (NaN where it cannot be read)."""

    cores: float = float("nan")
    own_cores: float = float("nan")  # what this process used meanwhile, for comparison
    all_cores: float = float("nan")  # every process together (this one's worker processes too)
    seconds: float = float("nan")  # the window's wall time
    _start: tuple = field(default=(), repr=False)

    def __enter__(self) -> Self:
        self._start = (time.perf_counter(), _busy_seconds(), _own_seconds())
        return self

    def __exit__(self, *_exc) -> None:
        wall0, busy0, own0 = self._start
        wall, busy = time.perf_counter() - wall0, _busy_seconds()
        self.seconds = wall
        if busy is None or busy0 is None or wall <= 0:
            return
        self.own_cores = (_own_seconds() - own0) / wall
        self.all_cores = (busy - busy0) / wall
        # Clock-tick granularity (10 ms) can make a quiet window read slightly negative.
        self.cores = max(0.0, (busy - busy0) / wall - self.own_cores)
