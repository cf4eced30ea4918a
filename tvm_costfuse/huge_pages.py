"""Back a process's large resident buffers (a model's weights) with 2 MiB transparent huge pages.

A decode step reads every weight once per token, so its GEMVs are bound by how fast one or two
cores stream memory. In 4 KiB pages that stream is short of what the memory delivers: every
4 KiB the core takes another TLB entry (a 9 MiB weight spans 2,300 pages, a step's weights more
than the second-level TLB holds) and the hardware prefetchers stop at the page's end. TVM's CPU
allocator (``posix_memalign``) gets 4 KiB pages wherever the host's THP mode is ``madvise``,
the common default. The same GEMV schedule over the same weights, interleaved in one process
(znver4, 2026-12-07): 1.4-1.7x faster at 1 thread, 1.2-1.3x at 2, in 2 MiB pages.

Nothing in TVM or the Relax VM says where a module's constants live, so :func:`collapse` works
on the process: every private read-write anonymous mapping, in 2 MiB-aligned chunks whose pages
are all resident already (so nothing reserved but untouched is allocated), is marked
``MADV_HUGEPAGE`` and collapsed now with ``MADV_COLLAPSE`` (Linux 6.1). Whatever else the
process holds (PyTorch's and ONNX Runtime's weights in a benchmark) gets the same pages, which
keeps comparisons even. Where the kernel or the host's THP mode refuses, nothing changes and
:class:`Collapsed` says why.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from dataclasses import dataclass

import numpy as np

CHUNK = 2 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"


@dataclass(frozen=True)
class Collapsed:
    """What :func:`collapse` did: bytes now in huge pages that were not before, and, where it
    could not act, the reason."""

    bytes: int
    skipped: str | None = None

    def describe(self) -> str:
        if self.skipped:
            return f"huge pages: not used ({self.skipped})"
        return f"huge pages: {self.bytes >> 20} MiB of resident buffers moved to 2 MiB pages"


def _anon_huge_kib() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


def _thp_mode() -> str | None:
    try:
        with open(_THP_MODE) as f:
            text = f.read()
    except OSError:
        return None
    return text[text.find("[") + 1:text.find("]")] if "[" in text else None


def anonymous_chunks() -> list[tuple[int, int]]:
    """``(start, end)`` of each 2 MiB-aligned stretch inside a private read-write anonymous
    mapping of this process (``/proc/self/maps``), largest mappings first."""
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            perms, inode = fields[1], fields[4]
            path = fields[5] if len(fields) > 5 else ""
            if perms != "rw-p" or inode != "0" or path not in ("", "[heap]"):
                continue
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            lo, hi = -(-lo // CHUNK) * CHUNK, hi // CHUNK * CHUNK
            if hi > lo:
                spans.append((lo, hi))
    return sorted(spans, key=lambda s: s[0] - s[1])


def _resident(libc, lo: int, hi: int) -> np.ndarray:
    """Per 2 MiB chunk of ``[lo, hi)``: whether every page of it is resident (``mincore``)."""
    pages = (hi - lo) // _PAGE
    vec = (ctypes.c_ubyte * pages)()
    if libc.mincore(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), vec) != 0:
        return np.zeros((hi - lo) // CHUNK, bool)
    bits = np.frombuffer(vec, np.uint8) & 1
    return bits.reshape(-1, CHUNK // _PAGE).all(axis=1)


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def resident_chunks(min_bytes: int = CHUNK) -> list[int]:
    """Start addresses of the fully resident 2 MiB chunks of this process's anonymous mappings
    of at least ``min_bytes``."""
    libc = _libc()
    return [lo + int(i) * CHUNK for lo, hi in anonymous_chunks() if hi - lo >= min_bytes
            for i in np.flatnonzero(_resident(libc, lo, hi))]


def collapse(min_bytes: int = CHUNK, keep: frozenset[int] = frozenset()) -> Collapsed:
    """Move this process's resident anonymous memory, in mappings of at least ``min_bytes``,
    to 2 MiB pages now, except the chunks starting at ``keep`` (an A/B's other side, from
    :func:`resident_chunks`). Call it after the model is loaded (its constants allocated) and
    before timing or serving; later allocations are not affected."""
    if not sys.platform.startswith("linux"):
        return Collapsed(0, f"{sys.platform} has no transparent huge pages")
    mode = _thp_mode()
    if mode not in ("always", "madvise"):
        return Collapsed(0, f"the host's THP mode is {mode or 'unknown'} ({_THP_MODE})")
    libc = _libc()
    before = _anon_huge_kib()
    refused = set()  # errno of each chunk refused: one chunk may be refused for its own reason
    for start in resident_chunks(min_bytes):
        if start in keep:
            continue
        if (libc.madvise(start, CHUNK, _MADV_HUGEPAGE) != 0
                or libc.madvise(start, CHUNK, _MADV_COLLAPSE) != 0):
            refused.add(ctypes.get_errno())
    gained = max(0, _anon_huge_kib() - before) << 10
    if gained == 0 and refused == {errno.EINVAL}:
        return Collapsed(0, "madvise refused MADV_COLLAPSE (it needs Linux 6.1+)")
    if gained == 0 and refused:
        return Collapsed(0, "madvise refused: " + ", ".join(sorted(map(os.strerror, refused))))
    return Collapsed(gained)
