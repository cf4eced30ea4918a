"""The register tile of the GEMM micro-kernel (``gemm.py``) and its cycle model.

The rule and the cost model (``efficiency.py``) both ask :func:`pick_tile`, so the share the
model prices is the one of the tile the rule builds.
"""

from __future__ import annotations

from dataclasses import dataclass

# Vectors per tile row: a power of two (LLVM legalizes 3- or 6-register vectors badly, see
# ``_common.vector_tile``).
VECTOR_COUNTS = (1, 2, 4)

# Cycles from one FMA to the next on the same accumulator (4 on Skylake and Zen 4, 5 on
# Haswell: the larger, so an AVX2 tile keeps 10+ chains): a tile of fewer than twice this many
# accumulators (2 FMA ports) waits on its own chains.
FMA_LATENCY = 5

# Vector loads and broadcasts issued per cycle. Two load ports in theory; measured on an
# AVX-512 host (emeraldrapids, ViT's 12 x 197 x 64 x 197 scores), a 22 x 1 tile (23 loads per
# 22 FMAs) ran 1.5x slower per FMA than 12 x 2 (14 per 24): about 1.5 per cycle.
LOADS_PER_CYCLE = 1.5

# What padding each image row to the tile costs on top of the padded lanes the cycle model
# counts: the padded copy of the streamed operand and the masked write-back of every row's
# last tile. Fitted on mobilenet_v2's three 1x1 convolutions at 28 x 28 (AVX-512, 1 thread):
# 16-row one-vector tiles over the 784 merged pixels, modeled 1.22x slower than 12 x 2 tiles
# over rows padded to 32, ran 1.1-1.44x faster (docs/log/2026-12-01b.md).
PADDED_ROWS_COST = 1.5

# A constant weight is packed at compile time with exactly its own width, so its tile's
# columns must divide it; where none does (an NHWC 1x1 convolution to 58 or 116 channels),
# the micro-kernel declined and the general tiling ran 2-lane vectors: 188 us for 28 x 28 x 58
# from 58 channels, priced 34. Where each weight element serves this many output rows, the
# weight is padded instead, by a copy each call (K x N floats read and written against
# M x K x N FMAs): that case 50 us, 14 x 14 x 116 89 -> 50 us; at 49 rows (7 x 7 x 232) the
# copy cost more than the half vectors it replaced (56 -> 77 us; rocketlake, 1 thread).
PAD_WEIGHT_ROWS = 64


@dataclass(frozen=True)
class Tile:
    """An output tile of ``rows x vectors`` registers of ``lanes`` lanes."""

    rows: int
    vectors: int
    lanes: int

    @property
    def cols(self) -> int:
        return self.vectors * self.lanes


def accumulator_budget(registers: int) -> int:
    """Vector registers a tile may hold: three quarters (24 of 32 zmm, 12 of 16 ymm); the rest
    hold the streamed vectors, the broadcast row value and spill-free address arithmetic."""
    return registers * 3 // 4


def tile_cycles(tile: Tile, m: int, n: int) -> float:
    """Relative time of the padded ``m x n`` output in ``tile``s, per reduction step.

    Per step a tile issues ``rows * vectors`` FMAs (2 per cycle) and ``rows + vectors`` loads
    (:data:`LOADS_PER_CYCLE`), and takes at least one FMA latency.
    """
    fmas = tile.rows * tile.vectors
    per_tile = max(fmas / 2, (tile.rows + tile.vectors) / LOADS_PER_CYCLE, FMA_LATENCY)
    return -(-m // tile.rows) * -(-n // tile.cols) * per_tile


def choose_tile(m: int, n: int, lanes: int, registers: int,
                cols_must_divide: bool = False) -> Tile | None:
    """The tile with the least estimated time for an ``m x n`` output (ties: more
    accumulators). ``cols_must_divide``: the columns may not be padded (a constant weight that
    is packed at compile time with exactly its own width)."""
    budget = accumulator_budget(registers)
    best, best_key = None, None
    for vectors in VECTOR_COUNTS:
        cols = vectors * lanes
        if cols_must_divide and n % cols:
            continue
        if vectors > 1 and cols > n + lanes - 1:
            continue  # a whole extra padded vector
        for rows in range(1, budget // vectors + 1):
            if rows > m:
                break
            tile = Tile(rows, vectors, lanes)
            key = (tile_cycles(tile, m, n), -rows * vectors, -vectors)
            if best_key is None or key < best_key:
                best, best_key = tile, key
    return best


def pick_tile(m: int, n: int, lanes: int, registers: int, weight: bool,
              height: int | None = None, reuse: int | None = None) -> tuple[Tile | None, int]:
    """(tile, column extent) for an ``m x n`` output; ``height``: the extent of an axis that
    can merge into the columns (``columns.py``), which is taken where a tile dividing the
    ``height * n`` merged columns is modeled no slower than tiling each of the ``height`` rows
    (padded: :data:`PADDED_ROWS_COST`). A merged axis is never padded: its tile must
    divide. ``reuse``: the output rows each weight element is used for, where more than ``m``
    (an image's other rows), which decides whether a ragged weight is padded."""
    tile = choose_tile(m, n, lanes, registers, cols_must_divide=weight)
    if tile is None and weight and max(m, reuse or 0) >= PAD_WEIGHT_ROWS:
        tile = choose_tile(m, n, lanes, registers)  # the weight padded by a copy per call
    if height is None or weight:
        return tile, n
    wide = choose_tile(m, n * height, lanes, registers, cols_must_divide=True)
    if wide is None:
        return tile, n
    if tile is None:
        return wide, n * height
    rows = height * tile_cycles(tile, m, n) * (PADDED_ROWS_COST if n % tile.cols else 1.0)
    return (wide, n * height) if tile_cycles(wide, m, n * height) <= rows else (tile, n)
