"""Back a process's large resident buffers (a model's weights) with 2 MiB transparent huge pages.

A decode step reads every weight once per token, so its GEMVs are bound by how fast one or two
cores stream memory. In 4 KiB pages that stream is short of what the memory delivers: every
4 KiB the core takes another TLB entry (a 9 MiB weight spans 2,300 pages, a step's weights more
than the second-level TLB holds) and the hardware prefetchers stop at the page's end. TVM's CPU
allocator (``posix_memalign``) gets 4 KiB pages wherever the host's THP mode is ``madvise``,
the common default. The same GEMV schedule over the same weights, interleaved in one process
(``lab/gemv_pages.py``, docs/log/2026-12-07b.md): 1.4-1.7x faster at 1 thread, 1.2-1.3x at 2,
in 2 MiB pages.

Nothing in TVM or the Relax VM says where a module's constants live, so :func:`collapse` works
on the process: every private read-write anonymous mapping, in 2 MiB-aligned chunks whose pages
are all resident already (so nothing reserved but untouched is allocated), is collapsed now
with ``MADV_COLLAPSE`` (Linux 6.1). Whatever else the process holds and has touched by then
(PyTorch's and ONNX Runtime's weights and pooled buffers in a benchmark) gets the same pages;
what a runtime allocates afresh on each call later, and file-backed memory (weights mapped
from a file), keep theirs. Where the kernel or the host's THP mode refuses, nothing changes and
:class:`Collapsed` says why.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from dataclasses import dataclass

import numpy as np

_THP = "/sys/kernel/mm/transparent_hugepage"
_THP_MODE = f"{_THP}/enabled"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MADV_COLLAPSE = 25


def _pmd_bytes() -> int:
    """The huge page's size: 2 MiB on x86-64 and on arm64 with 4 KiB base pages."""
    try:
        with open(f"{_THP}/hpage_pmd_size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 2 << 20


CHUNK = _pmd_bytes()


@dataclass(frozen=True)
class Collapsed:
    """What :func:`collapse` did: bytes now in huge pages that were not before, how many
    chunks the kernel refused (and why), or, where it could not act at all, the reason."""

    moved: int
    skipped: str | None = None
    refused: int = 0
    why_refused: str = ""

    def describe(self) -> str:
        if self.skipped:
            return f"huge pages: not used ({self.skipped})"
        text = (f"huge pages: {self.moved >> 20} MiB of resident buffers moved to "
                f"{CHUNK >> 20} MiB pages")
        if self.refused:
            text += f"; {self.refused} chunk(s) refused ({self.why_refused})"
        return text


def _anon_huge_kib() -> int | None:
    """AnonHugePages of this process, None where the kernel does not say."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _thp_mode() -> str | None:
    try:
        with open(_THP_MODE) as f:
            text = f.read()
    except OSError:
        return None
    return text[text.find("[") + 1:text.find("]")] if "[" in text else None


def _anonymous_spans() -> list[tuple[int, int]]:
    """``(start, end)`` of each 2 MiB-aligned stretch inside a private read-write anonymous
    mapping of this process (``/proc/self/maps``)."""
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            if not _private_anonymous(line):
                continue
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            lo, hi = -(-lo // CHUNK) * CHUNK, hi // CHUNK * CHUNK
            if hi > lo:
                spans.append((lo, hi))
    return spans


def _private_anonymous(maps_line: str) -> bool:
    """Whether a ``/proc/<pid>/maps`` line is a private read-write anonymous mapping: no file
    (inode 0), and unnamed, the heap, or named by its owner with ``PR_SET_VMA_ANON_NAME``
    (``[anon:glibc: malloc arena]`` and the like). The stack is left out by name; ``[vvar]``
    and ``[vdso]`` are not writable."""
    fields = maps_line.split()
    if len(fields) < 5 or fields[1] != "rw-p" or fields[4] != "0":
        return False
    path = fields[5] if len(fields) > 5 else ""
    return path in ("", "[heap]") or path.startswith("[anon:")


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


def resident_chunks() -> list[int]:
    """Start addresses of the fully resident 2 MiB chunks of this process's anonymous
    mappings."""
    libc = _libc()
    return [lo + int(i) * CHUNK for lo, hi in _anonymous_spans()
            for i in np.flatnonzero(_resident(libc, lo, hi))]


def collapse(keep: frozenset[int] = frozenset()) -> Collapsed:
    """Move this process's resident anonymous memory to huge pages now, except the chunks
    starting at ``keep`` (an A/B's other side, from :func:`resident_chunks`). Call it after
    the model is loaded (its constants allocated) and run once, before timing or serving;
    later allocations are not affected.

    Only ``MADV_COLLAPSE`` is issued, never ``MADV_HUGEPAGE``: a mark left on a chunk the
    kernel refused would let ``khugepaged`` collapse it later, in the middle of a timing run.
    Mappings read from ``/proc/self/maps`` may change before ``madvise`` reaches them (another
    thread frees or maps memory): a chunk gone is refused, one mapped anew in its place is
    collapsed as any other resident chunk would be."""
    if not sys.platform.startswith("linux"):
        return Collapsed(0, f"{sys.platform} has no transparent huge pages")
    mode = _thp_mode()
    if mode not in ("always", "madvise"):
        return Collapsed(0, f"the host's THP mode is {mode or 'unknown'} ({_THP_MODE})")
    before = _anon_huge_kib()
    if before is None:
        return Collapsed(0, "/proc/self/smaps_rollup is not readable here")
    libc = _libc()
    refused: dict[int, int] = {}  # errno -> chunks: each chunk may be refused for its own reason
    for start in resident_chunks():
        if start not in keep and libc.madvise(start, CHUNK, _MADV_COLLAPSE) != 0:
            err = ctypes.get_errno()
            refused[err] = refused.get(err, 0) + 1
    moved = max(0, (_anon_huge_kib() or 0) - before) << 10
    why = ", ".join(f"{os.strerror(e)}: {n}" for e, n in sorted(refused.items()))
    if moved == 0 and set(refused) == {errno.EINVAL}:
        return Collapsed(0, f"madvise refused MADV_COLLAPSE: a kernel before Linux 6.1 "
                            f"({os.uname().release} here), or THP disabled for this process")
    if moved == 0 and refused:
        return Collapsed(0, f"madvise refused every chunk ({why})")
    return Collapsed(moved, refused=sum(refused.values()), why_refused=why)
