"""``tvm_costfuse.huge_pages``: resident buffers moved to 2 MiB pages, or a reason why not.
Which of the two a host gives depends on its kernel and THP mode; both are asserted."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from tvm_costfuse import huge_pages
from tvm_costfuse.huge_pages import CHUNK, Collapsed

_KNOWN = ("no transparent huge pages", "THP mode", "MADV_COLLAPSE", "madvise refused",
          "smaps_rollup")


def _fresh(nbytes: int) -> tuple[mmap.mmap, np.ndarray]:
    """A private anonymous mapping of its own (not a malloc arena's reused memory), every
    page written."""
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    a = np.frombuffer(m, np.float32)
    a[:] = 1.0
    return m, a


def _huge_kib_in(a: np.ndarray) -> int:
    """AnonHugePages of the mappings overlapping ``a``'s bytes (``/proc/self/smaps``;
    marking chunks splits a mapping, so several may hold it)."""
    lo, hi = a.ctypes.data, a.ctypes.data + a.nbytes
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(x, 16) for x in head.split("-"))
                inside = start < hi and lo < end
            elif inside and head == "AnonHugePages:":
                total += int(line.split()[1])
    return total


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:"))


def _known(result: Collapsed) -> bool:
    """Nothing moved for a reason the module names (no THP, an old kernel, ...), or the kernel
    refused some chunks (a fragmented or memory-tight host) and said why."""
    reason = result.skipped or result.why_refused
    return bool(reason) and any(k in reason for k in _KNOWN + ("chunk",)) or result.refused > 0


def test_a_resident_buffer_moves_to_huge_pages_or_the_reason_is_given() -> None:
    m, buf = _fresh(16 * CHUNK)  # every page written
    result = huge_pages.collapse()
    if result.skipped or result.refused:
        assert _known(result), result
        if result.skipped:
            assert result.moved == 0 and "not used" in result.describe()
        return
    # in THP mode "always" the writes above may have faulted huge pages in already: what is
    # asserted is the state after the call, not what this call moved
    assert _huge_kib_in(buf) >= (15 * CHUNK) >> 10  # at least its aligned chunks
    assert float(buf.sum()) == buf.size  # the data survived the move
    assert "MiB of resident buffers" in result.describe()
    del buf
    m.close()


def test_chunks_kept_stay_as_they_were() -> None:
    """``keep`` is an A/B's other side: only what became resident after it was taken moves."""
    m1, first = _fresh(16 * CHUNK)
    # adjacent mappings of one kind merge into one, whose AnonHugePages would count both
    # buffers: a flag of no consequence here keeps the first one a mapping of its own
    m1.madvise(mmap.MADV_DONTFORK)
    keep = frozenset(huge_pages.resident_chunks())
    first_before = _huge_kib_in(first)
    m2, second = _fresh(8 * CHUNK)
    result = huge_pages.collapse(keep=keep)
    if result.skipped or result.refused:
        assert _known(result), result
        return
    assert _huge_kib_in(first) == first_before  # 0 in THP mode "madvise"
    assert _huge_kib_in(second) >= (7 * CHUNK) >> 10
    assert float(first.sum()) == first.size and float(second.sum()) == second.size
    del first, second
    m1.close()
    m2.close()


def test_untouched_memory_is_not_populated() -> None:
    """Only chunks whose every page is resident move: collapsing a reserved, never written
    range would allocate it."""
    reserved = mmap.mmap(-1, 32 * CHUNK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    before = _rss_kib()
    huge_pages.collapse()
    assert _rss_kib() - before < (16 * CHUNK) >> 10
    reserved.close()


@pytest.mark.parametrize(("line", "anonymous"), [
    ("7f00aa000000-7f00ac000000 rw-p 00000000 00:00 0 ", True),
    ("55d0c1a00000-55d0c1c00000 rw-p 00000000 00:00 0                          [heap]", True),
    ("7f00aa000000-7f00ac000000 rw-p 00000000 00:00 0    [anon:glibc: malloc arena]", True),
    ("7f00aa000000-7f00ac000000 rw-p 00000000 00:00 0    [anon:tvm]", True),
    ("7ffd1a000000-7ffd1a021000 rw-p 00000000 00:00 0                          [stack]", False),
    ("7ffd1a1f0000-7ffd1a1f4000 r--p 00000000 00:00 0                          [vvar]", False),
    ("7ffd1a1f4000-7ffd1a1f6000 r-xp 00000000 00:00 0                          [vdso]", False),
    ("7f00aa000000-7f00ac000000 r--p 00000000 00:00 0 ", False),  # read-only
    ("7f00aa000000-7f00ac000000 rw-s 00000000 00:01 4 /dev/zero (deleted)", False),  # shared
    ("7f00aa000000-7f00ac000000 rw-p 00001000 08:01 1234 /usr/lib/libtvm.so", False),  # a file
])
def test_which_mappings_are_private_anonymous(line, anonymous) -> None:
    assert huge_pages._private_anonymous(line) is anonymous


def test_off_linux_nothing_happens(monkeypatch) -> None:
    monkeypatch.setattr(huge_pages.sys, "platform", "darwin")
    assert huge_pages.collapse() == Collapsed(0, "darwin has no transparent huge pages")


def test_a_kernel_that_refuses_every_chunk_is_named(monkeypatch) -> None:
    """EINVAL on every chunk: a kernel without MADV_COLLAPSE, or THP disabled for the process;
    and no chunk is left marked for khugepaged to collapse later (only MADV_COLLAPSE is sent)."""
    calls = []

    class _Libc:
        def madvise(self, start, length, advice):
            calls.append(advice)
            huge_pages.ctypes.set_errno(huge_pages.errno.EINVAL)
            return -1

    monkeypatch.setattr(huge_pages, "_libc", _Libc)
    monkeypatch.setattr(huge_pages, "resident_chunks", lambda: [0, CHUNK])
    result = huge_pages.collapse()
    assert result.moved == 0 and "before Linux 6.1" in result.skipped
    assert calls == [25, 25]


def test_the_readmes_call_works_from_the_package() -> None:
    import tvm_costfuse

    assert tvm_costfuse.huge_pages.collapse is huge_pages.collapse
    assert "huge_pages" in tvm_costfuse.__all__
