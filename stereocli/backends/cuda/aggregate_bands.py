"""SGM's six vertical and diagonal paths in bands of rows (aggregate.py's line kernel
walks whole lines; this one is the CUDA backend's choice for 8 paths over 128 or 256
disparities from the KITTI size up, see use_bands).

The line kernel runs every path line at once, so the walks that add into a row of the
sum volume reach it at very different times and each addition reads and writes the
row in DRAM: 29-38 bytes of traffic a cell at 1920x1080 (README, GPU speed). Here the
paths from above (dx = 0, +1, -1) are walked one band of R rows at a time, top band
first, and at the same time the paths from below, bottom band first. A band's walks
step row by row together (a launch per band keeps them so), so the three paths add
into a row of the sum at about the same time and the row is read from DRAM and written
back about once for the three (at 1920x1080/256 a row's sums and costs are 1.5 MB). A band's walks start
from the path costs at the previous band's last row, kept in a small carry buffer (3 x
W x D uint16 and the minima; two of them, read and written by turns), so the sums are
those of whole lines, bit for bit. The horizontal pair is aggregate.py's kernel for
that pair only: beside the bands on a side stream, or before them (horizontal_first).
The bands add into the one uint16 sum with atomic adds, so their order does not matter.

A group of LW lanes (a warp at 256 disparities and more, half a warp at 128, so that a
lane holds two cost words; the simulator: one thread) takes a column x of the band's
first row and steps its three walks together, row by row (the pixels (x, y), (x + s, y),
(x - s, y) at step s); the diagonal walks that enter the band from its sides later are
extra groups, two walks each. Lane l of a group holds disparities 4 (l + LW i) + b (i <
D / (4 LW), b < 4): word i of a pixel's costs (uint32, four bytes) is lane l's, so a
group's loads and atomic adds are each one run of consecutive words. The costs are
loaded a row ahead. The path costs are kept as uint16 pairs and updated two at a time
(_make), and a step goes phase by phase over the three walks so that their shuffle
chains interleave.

H100, `benchmarks/gpu.py`, the kernels (census, SGM, selection, LR check) with the line
kernel for every path / with bands (twentieth session): 1920x1080/256/8 11.40 / 9.22 ms,
3840x2160/256/8 46.3 / 35.7; with the pairs, the phases, the horizontal pair first and
the register cap (twenty-first): 8.07 and 29.83 ms; with both sweeps at once and the
horizontal pair at 8 disparities a lane (twenty-second): 7.25 and 28.26 ms, and
1920x1080/128/8 4.91 -> 3.93 ms with bands of half-warp walks. Rows per band: 64
(1920x1080/256 with 16 / 32 / 64 rows, bands alone: 5.9 / 5.7 / 5.4-5.8 ms), 32 at
3840x2160/256 (rows_a_band); loading two or three rows ahead instead of one was slower.
"""
import functools
import os

import numpy as np
from numba import cuda, int32, uint32, uint64

from .common import (stable_cache_key, _REGS, BIG, CACHE, SGM_LANES, SGM_WARPS, SIM, atomic_add_at, auto_on_off, byte_perm, from_lane, group_min3_for,
                     group_min_for, min_u16x2_for)

L = SGM_LANES  # lanes of a warp (the simulator: 1, or STEREOCLI_SIM_LANES)
# Lanes of a walk at 128 disparities: 16 (two columns a warp, 2 words a lane) or 32 (one
# column, 1 word a lane). STEREOCLI_SGM_BAND_LANES=16|32 (measurements).
LANES_128 = int(os.environ.get("STEREOCLI_SGM_BAND_LANES", "16"))
BANDS = os.environ.get("STEREOCLI_SGM_BANDS", "auto")  # auto | on | off (tests and measurements)
HFIRST = os.environ.get("STEREOCLI_SGM_HFIRST", "auto")  # the horizontal pair first: auto | on | off
# The sweeps from above and from below at once, on two streams (each with its own carry;
# their atomic adds commute), or one after the other. H100, SGM ms apart / together (the
# horizontal pair where it was before), two rounds: 1920x1080/256/8 6.51-6.53 /
# 6.26-6.42, 3840x2160/128/8 14.0 / 12.3, 3840x2160/256/8 23.9-24.0 / 22.9-23.0: the
# serial chain of band launches is half as long, and one sweep's blocks fill what the
# other's leave idle. STEREOCLI_SGM_SWEEPS=together|apart.
SWEEPS_AT_ONCE = os.environ.get("STEREOCLI_SGM_SWEEPS", "together") == "together"
# Each band waits only for the parts of the horizontal pair (run first, in parts of rows
# as the census volume is made: CudaBackend._horizontal_first) over its rows, not for the
# whole pair. STEREOCLI_SGM_FOLLOW_HORIZONTAL=1|0 (measurements).
FOLLOW_HORIZONTAL = os.environ.get("STEREOCLI_SGM_FOLLOW_HORIZONTAL", "1") == "1"
BAND_ROWS = int(os.environ.get("STEREOCLI_SGM_BAND_ROWS", "4" if SIM else "64"))
# The 8-path bands at 256 disparities and more from BAND_ROWS_LARGE_MIN_CELLS cells (W x H
# x D; 3840x2160 / 256) take bands of BAND_ROWS_LARGE rows (rows_a_band). H100, kernel ms
# (gpu.py's kernel_times, best of 10), rounds alternated in one process over two machine
# starts (thirty-sixth session), bands of 64 / 32 / 48 / 24 / 96 / 128 / 16 rows:
# 3840x2160/256/8 24.44-24.59 (5 rounds) / 24.01-24.13 (5) / 24.07-24.12 (3) /
# 24.22-24.40 / 25.52-25.70 / 27.57-27.86 / 26.03-26.09; but 3840x2160/128/8 64 / 32
# rows 13.04-13.08 / 13.09-13.15, 1920x1080/256/8 6.36 / 6.34-6.37, and the 4-path bands
# (band4_shape) at 3840x2160/256/4 19.00 / 19.45-19.49. So 32 and 48 tie on the H100; the
# H200 (the lent GPU since the fortieth session) prefers 48: 3840x2160/256/8, three rounds
# alternated in one process, 32 / 40 / 48 rows 19.01-19.26 / 18.88-19.10 / 18.88-19.00,
# and with the redux at K = 8 (aggregate.SGM_REDUX_MAX_K) 18.91-18.94 / - / 18.78-18.83
# (forty-ninth session; the forty-first's: 19.50 / 19.28-19.34); on a later machine start,
# with the redux, 48 / 56 / 64 rows 18.81-18.94 / 18.78-18.90 / 18.91-18.99.
# STEREOCLI_SGM_BAND_ROWS sets both.
BAND_ROWS_LARGE = int(os.environ.get("STEREOCLI_SGM_BAND_ROWS", "4" if SIM else "48"))
BAND_ROWS_LARGE_MIN_CELLS = 1 << 30
BAND_REGISTER_CAP = 64  # 8 blocks of 4 warps an SM: a 3840-wide band's walks in one wave (band_kernel_for)
UNCAPPED_BLOCKS_PER_SM = 7  # the kernel's blocks an SM uncapped (72 registers, H100)
# The counts "auto" bands, from how many cells (W x H x D). 256: 1920x1080 and up. 128:
# from 3 x 2^24 cells (1242x375 and up; 741x500 keeps the line kernel). H100, SGM ms,
# line kernel / bands (both sweeps at once, the horizontal pair as horizontal_first
# picks), two rounds in separate processes (twenty-second session): 741x500/128/8
# 0.625-0.626 / 0.831-0.835, 1242x375/128/8 1.06 / 0.907-0.913, 1920x1080/128/8
# 4.01-4.02 / 3.18-3.20, 3840x2160/128/8 14.0 (bands, sweeps one after the other) /
# 12.27-12.33. (With the sweeps one after the other, bands lost below 3840x2160:
# 1920x1080/128/8 4.04-4.13 / 6.9-7.4, the horizontal pair first.) Half-warp walks at
# 128 (LANES_128) came after these figures.
BAND_MIN_CELLS = {128: 3 << 24, 256: 1 << 28}
HFIRST_MIN_CELLS = 3 << 27  # horizontal_first "auto"
# 4 paths: the horizontal pair first (in parts as the census volume is made), then the
# vertical pair in bands of one walk a group, the selection following the bands (use_bands4).
# From BANDS4_MIN_CELLS cells (W x H x D). H100, kernel ms (gpu.py's kernel_times, best of
# 10), the vertical pair then the horizontal pair as line kernels (aggregate.pairs_apart) /
# in bands: 1920x1080/256/4 5.51 / 5.28, 3840x2160/256/4 21.65 / 19.31 (aggregation 17.9 /
# 13.4, selection after the aggregation 2.23 / 0.19), 3840x2160/128/4 11.09 / 9.60,
# 1920x1080/128/4 2.705-2.719 / 2.642-2.648 (band4_shape); at 1920x1080/128/4 with half a
# warp a walk 2.72-2.74 whether the volume came in 4 parts or 8 (one: 2.76-2.78), and 2.83
# without the selection following. Not below 2^27 cells: the thirty-first session's
# measurements at 1242x375 and 741x500 (docs/speed.md).
BANDS4 = os.environ.get("STEREOCLI_SGM_BANDS4", "auto")  # auto | on | off
# The 4-path bands below BAND4_WIDE_MIN_CELLS cells: a warp a walk at 128 disparities
# (one cost word a lane) and bands of twice BAND_ROWS rows; from there half a warp a walk
# and BAND_ROWS. H100, kernel ms, two rounds alternated in one process: 1920x1080/128/4
# the pairs apart 2.705-2.719, in bands of 16 lanes 2.718-2.723, 32 lanes 2.662-2.663
# (128 rows 2.642-2.648, 32 rows 2.762-2.772); 3840x2160/128/4 apart 11.09, 16 lanes 9.60,
# 32 lanes 9.68. STEREOCLI_SGM_BAND4_LANES=16|32 and STEREOCLI_SGM_BAND4_ROWS override.
BAND4_WIDE_MIN_CELLS = 1 << 29
LANES_128_4 = int(os.environ.get("STEREOCLI_SGM_BAND4_LANES", "0"))  # 0: by size (band4_shape)
BAND4_ROWS = int(os.environ.get("STEREOCLI_SGM_BAND4_ROWS", "0"))  # 0: by size (band4_shape)
BANDS4_MIN_CELLS = 1 << 27
# The 4-path bands' horizontal pair (run first) in the shape of the 8-path one
# (aggregate.sgm_shape's `horizontal`: SGM_HORIZONTAL_K = 8 disparities a lane, a warp a
# line at 256) from PAIR4_HSHAPE_FROM disparities, else the general shape (K = 16, half
# a warp a line at 256; K = 4 at 128). H100, kernel ms (gpu.py's kernel_times, best of
# 10), three rounds alternated in one process (thirty-sixth session), general / the
# 8-path pair's shape: 1920x1080/256/4 5.28-5.30 / 5.13-5.14 (two more rounds: 5.28-5.30 /
# 5.13-5.14), 3840x2160/256/4 19.43-19.50 / 18.99-19.00; at 128 (K = 8, half a warp a
# line) 1920x1080/128/4 2.63-2.64 / 3.28-3.30 and 3840x2160/128/4 9.59-9.69 / 10.53-10.57.
# STEREOCLI_SGM_PAIR4_HSHAPE_FROM overrides it.
PAIR4_HSHAPE_FROM = int(os.environ.get("STEREOCLI_SGM_PAIR4_HSHAPE_FROM", "256"))


def pair4_horizontal_shape(n: int) -> bool:
    """Whether the 4-path bands' horizontal pair over n disparities asks for the 8-path
    pair's shape (PAIR4_HSHAPE_FROM; aggregate.sgm_shape gives it up to what a warp
    holds)."""
    return n >= PAIR4_HSHAPE_FROM


_KERNELS = {}


def use_bands4(n: int, paths: int, cells: int, vec: bool) -> bool:
    """Whether SGM over 4 paths runs the horizontal pair first, then the vertical pair in
    bands of one walk a group (so that the selection can follow the bands as they finish
    rows): 4 paths, n a multiple of 4 lanes' words, and ("auto") from BANDS4_MIN_CELLS
    cells. STEREOCLI_SGM_BANDS4=auto|on|off."""
    if paths != 4 or n % (4 * L):
        return False
    return auto_on_off(BANDS4, not SIM and vec and cells >= BANDS4_MIN_CELLS)


def use_bands(n: int, paths: int, cells: int, vec: bool) -> bool:
    """Whether SGM over `paths` directions with n disparities runs in bands: 8 paths, n a
    multiple of 4 lanes' words, and ("auto") a count of BAND_MIN_CELLS on at least its
    number of cells of a GPU's packed sum volume."""
    if paths != 8 or n % (4 * L):
        return False
    return auto_on_off(BANDS, not SIM and vec and cells >= BAND_MIN_CELLS.get(n, 1 << 62))


def horizontal_first(cells: int) -> bool:
    """Whether the horizontal pair runs before the bands, alone, storing its costs where
    it comes first (no zeroed sum, and the sum read once fewer), instead of beside them
    on a side stream, where its blocks hold registers for the whole sweep. "auto": from
    HFIRST_MIN_CELLS cells (W x H x D), between the sizes measured. H100, SGM ms beside /
    first, both sweeps at once, two rounds: 1242x375/128/8 0.907-0.913 / 1.415-1.423,
    1920x1080/128/8 3.18-3.20 / 3.67-3.69, 1920x1080/256/8 6.30-6.36 / 6.15-6.18,
    3840x2160/128/8 13.4 / 12.27-12.32, 3840x2160/256/8 26.7 / 22.98-22.99.
    STEREOCLI_SGM_HFIRST=auto|on|off."""
    return auto_on_off(HFIRST, cells >= HFIRST_MIN_CELLS)


def rows_a_band(n: int, cells: int) -> int:
    """Rows a band of the 8-path bands over n disparities and `cells` cells (W x H x D):
    BAND_ROWS, or BAND_ROWS_LARGE at 256 disparities and more from BAND_ROWS_LARGE_MIN_CELLS."""
    return BAND_ROWS_LARGE if n >= 256 and cells >= BAND_ROWS_LARGE_MIN_CELLS else BAND_ROWS


def band4_shape(cells: int) -> tuple:
    """(lanes a walk at 128 disparities, rows a band) of the 4-path bands over `cells`
    cells (W x H x D): see BAND4_WIDE_MIN_CELLS."""
    wide = cells >= BAND4_WIDE_MIN_CELLS
    return LANES_128_4 or (16 if wide else 32), BAND4_ROWS or (BAND_ROWS if wide else 2 * BAND_ROWS)


def walk_lanes(n: int, nw: int = 3, cells: int = 0) -> int:
    """Lanes of a walk for n disparities: a warp's (32) from 256 disparities, at 128
    LANES_128 for the 8-path bands (three walks a group, so that a lane holds two cost
    words) and band4_shape's for the 4-path ones over `cells` cells (nw = 1) (the
    simulator: its warp's lanes)."""
    if SIM or n != 128:
        return L
    return LANES_128 if nw == 3 else band4_shape(cells)[0]


def band_kernel_for(n: int, vec: bool, walks: int = 0, sms: int = 1, nw: int = 3, cells: int = 0):
    """(kernel, walks per block, threads per block) for n disparities (walk_lanes lanes
    of K4 = n / (4 lanes) words a walk) and a first band of `walks` walk groups on `sms`
    SMs: capped at BAND_REGISTER_CAP registers when the uncapped kernel (72 registers,
    7 blocks an SM) would need a second wave.

    A band's walks all take its R steps, so a launch lasts as many times R steps as it
    has waves, and a small second wave costs as much as a full one. H100, SGM ms
    (bands alone), two rounds: 3840x2160/256/8 (976 blocks) uncapped 17.9 (1.06 waves),
    at 64 registers 15.2-15.3 (one wave, a few bytes spilled); 1920x1080/256/8 (496
    blocks, one wave either way) 5.8-6.0 / 6.3-6.5."""
    cc = (0, 0) if SIM else tuple(cuda.get_current_device().compute_capability)
    lw = walk_lanes(n, nw, cells)
    per_block = SGM_WARPS * (L // lw)
    capped = nw == 3 and (walks + per_block - 1) // per_block > UNCAPPED_BLOCKS_PER_SM * sms
    key = (n // (4 * lw), lw, vec, cc, capped, nw)
    if key not in _KERNELS:
        _KERNELS[key] = _make(*key)
    return _KERNELS[key], per_block, L * SGM_WARPS


def band_rows(h: int, ys: int, dy: int, R: int) -> int:
    """Rows of the band whose first row is ys (dy: the sweep's direction)."""
    return min(R, h - ys if dy > 0 else ys + 1)


_band_rows = cuda.jit(device=True, inline=True)(band_rows)  # the kernel's twin


@functools.lru_cache(maxsize=64)
def finished_rows(h: int, R: int, order: tuple) -> list:
    """The rows of the sum in the order the bands finish them: [(y0, y1, [(b, k), ...])],
    rows y0..y1 - 1 complete once the launches of the listed bands (band b of sweep k:
    0 from above, 1 from below) have run, ordered by the last of those in `order` (the
    bands' launches, in the order they are queued). Row y is in band y // R of the sweep
    from above and band (h - 1 - y) // R of the one from below; runs of rows finished by
    the same launch are one range; a range lists the last band of each sweep it waits
    for (a sweep's bands run in order on its stream)."""
    pos = {bk: i for i, bk in enumerate(order)}
    nb = (h + R - 1) // R
    cuts = sorted({0, h} | {b * R for b in range(1, nb)} | {h - b * R for b in range(1, nb)})
    runs = []  # [y0, y1, {sweep: its last band}, position of the last launch]
    for y0, y1 in zip(cuts, cuts[1:]):
        last = {0: y0 // R, 1: (h - 1 - y0) // R}
        t = max(pos[b, k] for k, b in last.items())
        if runs and runs[-1][3] == t:
            runs[-1][1] = y1
            runs[-1][2] = {k: max(b, runs[-1][2][k]) for k, b in last.items()}
        else:
            runs.append([y0, y1, last, t])
    return [(y0, y1, sorted((b, k) for k, b in last.items())) for y0, y1, last, _ in sorted(runs, key=lambda r: r[3])]


def walks(h: int, w: int, ys: int, dy: int, R: int, nw: int = 3) -> int:
    """Walk groups of the band whose first row is ys: a column each, and (nw = 3) one per
    later row for the diagonals entering from the sides."""
    return w + (max(0, band_rows(h, ys, dy, R) - 1) if nw == 3 else 0)


@cuda.jit(device=True, inline=True)
def _path(j, side):
    """The path (dx = 0, 1, -1) of a group's walk j: j, or in a side group (its walks
    entering the band from the left and right edges) 1, 2, then 0 (not walked)."""
    return j if side == 0 else (j + 1) % 3


@cuda.jit(device=True, inline=True)
def _dx(k):
    """Path k's step along x."""
    return int32(0 if k == 0 else (1 if k == 1 else -1))


def _make(K4, LW, vec, cc, capped, NW):
    """The band kernel for K4 cost words (4 K4 disparities) a lane. A lane keeps its path
    costs as uint16 pairs in uint32 words (P[walk, 2 i + h]: disparities 4 (gl + LW i)
    + 2 h and + 1, gl its place in its group) and updates both halves at once: the
    costs stay below 2^15 (aggregate.EDGE), so a 32-bit add or subtract of two pairs
    carries nothing from one half into the other, and the minima are min_u16x2 (one
    instruction on Hopper). Offsets into the volumes are unsigned and stepped a row at a
    time (no per-access multiply by a run-time size, no negative-index fix-up). LW lanes
    take a walk group (a column's three walks): 32 // LW groups a warp, side by side,
    each its own column."""
    min2 = min_u16x2_for(cc)
    prmt = byte_perm()
    GW = L // LW  # walk groups a warp
    gmin3 = group_min3_for(LW)
    gmin1 = group_min_for(LW)
    K2 = 2 * K4  # a lane's uint16 pairs
    PER = np.uint64(K4 * LW if vec else 4 * K4 * LW)  # a pixel's words (vec: C1 uint32, S1 uint64) or costs
    WSTEP = np.uint64(LW if vec else 4 * LW)  # from a lane's word i to its word i + 1
    HALF = np.uint64(2 * K4 * LW)  # a pixel's uint16 pairs in the carry (n / 2)
    U0, U1, U2 = np.uint64(0), np.uint64(1), np.uint64(2)
    B2 = np.uint32(0xFFFF)
    S8, S16, S32 = np.uint32(8), np.uint32(16), np.uint64(32)
    PAIR = np.uint32(0x10001)  # x * PAIR: x in both halves
    ALL = np.uint32(0xFFFFFFFF)

    @cuda.jit(device=True, inline=True)
    def load(C1, off, q, j):
        """Row j of q: this lane's K4 cost words of a pixel, off its lane's first word
        (vec) or first cost there."""
        for i in range(K4):
            o = off + uint64(i) * WSTEP
            if vec:
                q[j, i] = C1[o]
            else:
                q[j, i] = (uint32(C1[o]) | (uint32(C1[o + U1]) << S8) | (uint32(C1[o + U2]) << S16)
                           | (uint32(C1[o + np.uint64(3)]) << np.uint32(24)))

    @cuda.jit(device=True, inline=True)
    def add(S1, off, P, j):
        """Walk j's path costs added into the sum at the pixel whose lane offset is off."""
        for i in range(K4):
            o = off + uint64(i) * WSTEP
            if vec:  # uint64 words of four uint16 sums: the two pairs side by side
                atomic_add_at(S1, o, uint64(P[j, 2 * i]) | (uint64(P[j, 2 * i + 1]) << S32))
            else:
                for hh in range(2):
                    v = P[j, 2 * i + hh]
                    atomic_add_at(S1, o + uint64(2 * hh), uint32(v & B2))
                    atomic_add_at(S1, o + uint64(2 * hh + 1), uint32(v >> S16))

    @cuda.jit(device=True, inline=True)
    def pairs(word):
        """A cost word's four bytes as two uint16 pairs (bytes 0, 1 and bytes 2, 3): a
        byte permute each (PRMT). H200, kernel ms (gpu_variants, three rounds alternated)
        with shifts and masks / permutes, the costs added before the minimum is taken off
        (below): 3840x2160/256/8 19.68-20.02 / 19.32-19.54, 1920x1080/256/8 5.73-5.75 /
        5.53-5.54, 1920x1080/128/8 3.07-3.08 / 3.03, 1242x375/128/8 0.854-0.858 /
        0.835-0.838 (the loop 597 -> 564 instructions at 256 disparities)."""
        return prmt(word, uint32(0), uint32(0x4140)), prmt(word, uint32(0), uint32(0x4342))

    @cuda.jit(cache=CACHE, **_REGS("STEREOCLI_SGM_BAND_REGS", BAND_REGISTER_CAP if capped else 0))
    def kernel(C1, G1, h, w, n, p1, p2g, S1, ys, R, dy, cin, min_in, cout, mout, first):
        """One band: rows ys, ys + dy, ... (R of them, fewer at the image's edge) of the
        three paths of direction (dx, dy), dx = 0, 1, -1. C1, G1, S1 flat (vec: C1 as
        uint32 words, S1 as uint64 words); cin/min_in: the carry of the previous band
        (unless `first`), cout/mout: this band's: (3 paths, w, n / 2) uint16 pairs and
        (3, w) minima, flat."""
        p2tab = cuda.shared.array(256, int32)
        scratch = cuda.shared.array((SGM_WARPS, SGM_LANES), int32)  # the simulator's exchange
        for i in range(cuda.threadIdx.x, 256, cuda.blockDim.x):
            p2tab[i] = p2g[i]
        cuda.syncthreads()
        lane = cuda.threadIdx.x % L
        wi = cuda.threadIdx.x // L
        grp = lane // LW  # this lane's walk group in the warp, and its place there
        gl = lane % LW
        t = (cuda.blockIdx.x * SGM_WARPS + wi) * GW + grp
        rows = int32(_band_rows(h, ys, dy, R))
        w32 = int32(w)
        # The walks: a column each, and bit j of `live` for walk j; the group's first step
        # s0 and whether it is a side group (_path) are one value for the group.
        xs = cuda.local.array(NW, int32)
        ms = cuda.local.array(NW, int32)  # min L at the previous pixel
        gs = cuda.local.array(NW, int32)  # grey level there
        P = cuda.local.array((NW, K2), uint32)
        q = cuda.local.array((NW, K4), uint32)  # the next pixel's cost words
        qg = cuda.local.array(NW, int32)
        if NW == 1:  # the vertical walk alone
            if t - grp >= w:
                return  # the whole warp is past the band's columns
            side = 0
            s0 = int32(0)
            xs[0] = t
            live = int32(1 if t < w else 0)  # bit j: walk j alive
        elif t < w:
            side = 0
            s0 = int32(0)
            live = int32(7)
            for j in range(3):
                xs[j] = t
        else:
            e = t - w
            if e - grp >= rows - 1:
                return  # the whole warp is past the band's walks
            side = 1
            s0 = int32(1 + e)
            for j in range(3):  # (a group past them walks nothing, but its lanes shuffle)
                xs[j] = 0 if j == 0 else w - 1
            live = int32(3 if e < rows - 1 else 0)
        wu = uint64(w)
        drow = wu if dy > 0 else U0 - wu  # from a row's first pixel to the next row's, mod 2^64
        rp = uint64(ys) * wu  # the first pixel of the step's row
        lo = uint64(gl) if vec else uint64(4 * gl)  # the lane's first word (cost) of a pixel
        for j in range(NW):
            if live & (1 << j):
                pix = rp + uint64(s0) * drow + uint64(xs[j])
                load(C1, pix * PER + lo, q, j)
                qg[j] = int32(G1[pix])
        p1i = int32(p1)
        p1p = uint32(uint32(p1i) * PAIR)
        words = cuda.local.array((NW, K4), uint32)  # this row's cost words
        gc = cuda.local.array(NW, int32)  # its grey level
        p2s = cuda.local.array(NW, int32)  # its P2
        mps = cuda.local.array(NW, uint32)  # the pairs' minimum of its new L
        for j in range(NW):
            for i in range(K2):
                P[j, i] = uint32(0)
            for i in range(K4):
                words[j, i] = uint32(0)
            ms[j] = 0
            gs[j] = 0
        up = grp * LW + (gl + 1) % LW
        down = grp * LW + (gl + LW - 1) % LW
        one = int32(1)
        s = int32(0)  # (32-bit counters and compares: the loop's bookkeeping is a good part of its work)
        while s < rows:
            # The three walks' steps go phase by phase (positions and loads; the update;
            # the minima; the adds), so their shuffle chains interleave instead of each
            # waiting on the one before. A walk not at a pixel this step computes on what
            # it holds and stores nothing.
            for j in range(NW):
                if live & (1 << j) and s >= s0:  # (the walk is at a pixel this step)
                    k = _path(j, side)
                    dx = _dx(k)
                    if s > s0:
                        xs[j] = int32(xs[j] + dx)
                    x = xs[j]
                    g = qg[j]
                    for i in range(K4):
                        words[j, i] = q[j, i]
                    xn = int32(x + dx)
                    if int32(s + one) < rows and uint32(xn) < uint32(w32):  # the next row's loads
                        pn = rp + drow + uint64(xn)
                        load(C1, pn * PER + lo, q, j)
                        qg[j] = int32(G1[pn])
                    xp = int32(x - dx)
                    cont = s > s0 or (s == 0 and not first and uint32(xp) < uint32(w32))
                    if s == s0:
                        if cont:  # the band's first row: from the previous band's last
                            cb = uint64(k * w + xp) * HALF + uint64(2 * gl)
                            for i in range(K4):
                                for hh in range(2):
                                    P[j, 2 * i + hh] = cin[cb + uint64(2 * LW * i + hh)]
                            ms[j] = min_in[uint64(k * w + xp)]
                            gs[j] = int32(G1[rp - drow + uint64(xp)])
                        else:  # a path's first pixel: L = C, the update of L = 0 (and min 0)
                            for i in range(K2):
                                P[j, i] = uint32(0)
                            ms[j] = 0
                    gc[j] = g
                    p2s[j] = p2tab[uint32(abs(int32(g - gs[j])))]
            for j in range(NW):
                m = ms[j]
                mm = uint32(uint32(m) * PAIR)
                mp2 = uint32(uint32(m + p2s[j]) * PAIR)
                mp = ALL
                below = uint32(BIG)  # (lane 0) disparity 4 L i - 1: lane L - 1's last of word i - 1
                for i in range(K4):
                    a = P[j, 2 * i]  # disparities 4 (lane + L i) + 0, 1
                    b = P[j, 2 * i + 1]  # + 2, 3
                    # (the pairs are below 2^31: exchanged as int32)
                    tl = uint32(uint32(from_lane(int32(b), down, scratch, wi, lane)) >> S16)  # below a's
                    tu = uint32(uint32(from_lane(int32(a), up, scratch, wi, lane)) & B2)  # above b's
                    tn = uint32(BIG)
                    if i + 1 < K4:
                        tn = uint32(uint32(from_lane(int32(P[j, 2 * i + 2]), up, scratch, wi, lane)) & B2)
                    lo_in = tl if gl > 0 else below
                    hi_in = tu if gl < LW - 1 else tn
                    below = tl
                    xa = uint32(lo_in | uint32(a << S16))  # the neighbours below a's pair
                    xb = uint32(uint32(a >> S16) | uint32(b << S16))  # above a's, below b's
                    xc = uint32(uint32(b >> S16) | uint32(hi_in << S16))  # above b's
                    c0, c1 = pairs(words[j, i])
                    # sgm_value on both halves: c + min(L, min(lo, hi) + P1, m + P2) - m (each
                    # half's minimum is at least m, so the 32-bit sum in any order is exact:
                    # the compiler takes c - m off the chain of the walk's steps)
                    va = uint32(uint32(min2(min2(a, uint32(min2(xa, xb) + p1p)), mp2) + c0) - mm)
                    vb = uint32(uint32(min2(min2(b, uint32(min2(xb, xc) + p1p)), mp2) + c1) - mm)
                    P[j, 2 * i] = va
                    P[j, 2 * i + 1] = vb
                    mp = min2(mp, min2(va, vb))
                mps[j] = mp
            if NW == 1:
                m0 = gmin1(int32(min(uint32(mps[0] & B2), uint32(mps[0] >> S16))), scratch, wi, lane)
                m1 = m0
                m2 = m0
            else:
                m0, m1, m2 = gmin3(int32(min(uint32(mps[0] & B2), uint32(mps[0] >> S16))),
                                   int32(min(uint32(mps[1] & B2), uint32(mps[1] >> S16))),
                                   int32(min(uint32(mps[2] & B2), uint32(mps[2] >> S16))), scratch, wi, lane)
            for j in range(NW):
                if live & (1 << j) and s >= s0:
                    mloc = m0 if j == 0 else (m1 if j == 1 else m2)
                    ms[j] = mloc
                    gs[j] = gc[j]
                    k = _path(j, side)
                    x = xs[j]
                    add(S1, (rp + uint64(x)) * PER + lo, P, j)
                    if int32(s + one) == rows:
                        cb = uint64(k * w + x) * HALF + uint64(2 * gl)
                        for i in range(K4):
                            for hh in range(2):
                                cout[cb + uint64(2 * LW * i + hh)] = P[j, 2 * i + hh]
                        if gl == 0:
                            mout[uint64(k * w + x)] = mloc
                    if uint32(int32(x + _dx(k))) >= uint32(w32):
                        live &= ~(1 << j)  # the walk leaves the image at the side
            rp += drow
            s = int32(s + one)
    return stable_cache_key(kernel)
