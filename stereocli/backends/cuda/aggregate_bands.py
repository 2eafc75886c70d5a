"""SGM's six vertical and diagonal paths in bands of rows (aggregate.py's line kernel
walks whole lines; this one is the CUDA backend's choice for 256 disparities on large
images, see use_bands).

The line kernel runs every path line at once, so the walks that add into a row of the
sum volume reach it at very different times and each addition reads and writes the
row in DRAM: 29-38 bytes of traffic a cell at 1920x1080 (README, GPU speed). Here the
paths from above (dx = 0, +1, -1) are walked one band of R rows at a time, top band
first, then the paths from below, bottom band first. A band's walks step row by row
together (a launch per band keeps them so), so the three paths add into a row of the
sum at about the same time and the row is read from DRAM and written back about once
for the three (at 1920x1080/256 a row's sums and costs are 1.5 MB). A band's walks start
from the path costs at the previous band's last row, kept in a small carry buffer (3 x
W x D uint16 and the minima; two of them, read and written by turns), so the sums are
those of whole lines, bit for bit. The horizontal pair runs at the same time on a side
stream (aggregate.py's kernel, that pair only); everything adds into the one uint16 sum
with atomic adds, so the order does not matter.

A warp (the simulator: one thread) takes a column x of the band's first row and steps
its three walks together, row by row (the pixels (x, y), (x + s, y), (x - s, y) at step
s); the diagonal walks that enter the band from its sides later are extra warps, two
walks each. Lane l holds disparities 4 (l + 32 i) + b (i < D / 128, b < 4): word i of
a pixel's costs (uint32, four bytes) is lane l's, so a warp's loads and atomic adds are
each one run of consecutive words. The costs are loaded a row ahead.

H100, `benchmarks/gpu.py --configs 1920x1080/256/8,3840x2160/256/8`, the line kernel for
every path (STEREOCLI_SGM_BANDS=off) against bands, two rounds in separate processes:
SGM 9.84-9.86 -> 7.66-7.73 ms at 1920x1080/256 and 40.6 -> 29.9-30.0 ms at 3840x2160/256;
the kernels in all 11.40-11.43 -> 9.22-9.29 and 46.3-46.4 -> 35.7; end to end (best of
15) 13.44-13.55 -> 10.89-10.93 ms at 1920x1080/256/8. At 128 disparities the bands were
slower (a scratch version at 1920x1080/128: 4.05 ms -> 5.9, the bands alone 4.5-4.9:
a warp's three walks wait on each step, and the kernel had 15 warps an SM against the
line kernel's 36), so "auto" takes them at 256 only; nor is the kernel built for more
(registers). Rows per band: 64 (1920x1080/256 with 16 / 32 / 64 rows, bands alone:
5.9 / 5.7 / 5.4-5.8 ms); loading two or three rows ahead instead of one was slower.
"""
import os

from numba import cuda, int32, uint32, uint64

from .aggregate import agg
from .common import BIG, CACHE, SGM_LANES, SGM_WARPS, SIM, from_lane, warp_min

L = SGM_LANES  # lanes of a walk (the simulator: 1, or STEREOCLI_SIM_LANES)
BANDS = os.environ.get("STEREOCLI_SGM_BANDS", "auto")  # auto | on | off (tests and measurements)
BAND_ROWS = int(os.environ.get("STEREOCLI_SGM_BAND_ROWS", "4" if SIM else "64"))
BAND_DISPARITIES = 256  # the only count "auto" bands (see the module's docstring)
BAND_MIN_CELLS = 1 << 28  # W x H x D: 1920x1080x256 and up
_KERNELS = {}


def use_bands(n: int, paths: int, cells: int, vec: bool) -> bool:
    """Whether SGM over `paths` directions with n disparities runs in bands: 8 paths, n a
    multiple of 4 lanes' words, and ("auto") 256 disparities on at least BAND_MIN_CELLS
    cells of a GPU's packed sum volume."""
    if paths != 8 or n % (4 * L) or BANDS == "off":
        return False
    if BANDS == "on":
        return True
    return not SIM and vec and n == BAND_DISPARITIES and cells >= BAND_MIN_CELLS


def band_kernel_for(n: int, vec: bool):
    """(kernel, walks per block) for n disparities: K4 = n / (4 L) words a lane."""
    key = (n // (4 * L), vec)
    if key not in _KERNELS:
        _KERNELS[key] = _make(*key)
    return _KERNELS[key], SGM_WARPS


def walks(h: int, w: int, ys: int, dy: int, R: int) -> int:
    """Walk groups of the band whose first row is ys (dy: the sweep's direction): a
    column each, and one per later row for the diagonals entering from the sides."""
    rows = min(R, h - ys if dy > 0 else ys + 1)
    return w + max(0, rows - 1)


def _make(K4, vec):
    K = 4 * K4

    @cuda.jit(device=True, inline=True)
    def load(C1, base, lane, q, j):
        """Row j of q: this lane's K4 cost words of the pixel whose first cost is C1's
        element `base` (vec: C1 holds uint32 words, and base is a word index)."""
        for i in range(K4):
            if vec:
                q[j, i] = C1[base + uint64(lane + L * i)]
            else:
                o = base + uint64(4 * (lane + L * i))
                q[j, i] = (uint32(C1[o]) | (uint32(C1[o + uint64(1)]) << uint32(8))
                           | (uint32(C1[o + uint64(2)]) << uint32(16)) | (uint32(C1[o + uint64(3)]) << uint32(24)))

    @cuda.jit(device=True, inline=True)
    def add(S1, base, lane, prev, j):
        """prev[j] added into the sum at the pixel whose first element is S1's `base`
        (vec: uint64 words of four uint16 sums, base a word index; else uint32 sums)."""
        for i in range(K4):
            if vec:
                word = (uint64(prev[j, 4 * i] & 0xFFFF) | (uint64(prev[j, 4 * i + 1] & 0xFFFF) << uint64(16))
                        | (uint64(prev[j, 4 * i + 2] & 0xFFFF) << uint64(32))
                        | (uint64(prev[j, 4 * i + 3] & 0xFFFF) << uint64(48)))
                cuda.atomic.add(S1, base + uint64(lane + L * i), word)
            else:
                for b in range(4):
                    cuda.atomic.add(S1, base + uint64(4 * (lane + L * i) + b), uint32(prev[j, 4 * i + b]))

    @cuda.jit(cache=CACHE)
    def kernel(C1, G1, h, w, n, p1, p2g, S1, ys, R, dy, cin, min_in, cout, mout, first):
        """One band: rows ys, ys + dy, ... (R of them, fewer at the image's edge) of the
        three paths of direction (dx, dy), dx = 0, 1, -1. C1, G1, S1 flat (vec: C1 as
        uint32 words, S1 as uint64 words); cin/min_in: the carry of the previous band
        (unless `first`), cout/mout: this band's, both (3 paths, w, n) / (3, w), flat."""
        p2tab = cuda.shared.array(256, int32)
        scratch = cuda.shared.array((SGM_WARPS, SGM_LANES), int32)  # the simulator's exchange
        for i in range(cuda.threadIdx.x, 256, cuda.blockDim.x):
            p2tab[i] = p2g[i]
        cuda.syncthreads()
        lane = cuda.threadIdx.x % L
        wi = cuda.threadIdx.x // L
        t = cuda.blockIdx.x * SGM_WARPS + wi
        rows = min(R, (h - ys) if dy > 0 else ys + 1)
        ks = cuda.local.array(3, int32)  # the walks: path (dx = 0, 1, -1), column, first step, alive
        xs = cuda.local.array(3, int32)
        s0 = cuda.local.array(3, int32)
        live = cuda.local.array(3, int32)
        ms = cuda.local.array(3, int32)  # min L at the previous pixel
        gs = cuda.local.array(3, int32)  # grey level there
        prev = cuda.local.array((3, K), int32)
        q = cuda.local.array((3, K4), uint32)  # the next pixel's cost words
        qg = cuda.local.array(3, int32)
        if t < w:
            for j in range(3):
                ks[j] = j
                xs[j] = t
                s0[j] = 0
                live[j] = 1
        else:
            e = t - w
            if e >= rows - 1:
                return
            for j in range(3):
                ks[j] = 1 + j if j < 2 else 0
                xs[j] = 0 if j == 0 else w - 1
                s0[j] = 1 + e
                live[j] = 1 if j < 2 else 0
        per = uint64(n >> 2) if vec else uint64(n)  # a pixel's words (vec) or costs
        for j in range(3):
            if live[j] != 0:
                y = ys + s0[j] * dy
                load(C1, uint64(y * w + xs[j]) * per, lane, q, j)
                qg[j] = int32(G1[y * w + xs[j]])
        p1i = int32(p1)
        words = cuda.local.array(K4, uint32)
        for s in range(rows):
            y = ys + s * dy
            for j in range(3):
                if live[j] == 0 or s < s0[j]:
                    continue
                k = ks[j]
                dx = 0 if k == 0 else (1 if k == 1 else -1)
                if s > s0[j]:
                    xs[j] += dx
                x = xs[j]
                g = qg[j]
                for i in range(K4):
                    words[i] = q[j, i]
                xn = x + dx
                if s + 1 < rows and 0 <= xn < w:  # the next row's loads
                    yn = y + dy
                    load(C1, uint64(yn * w + xn) * per, lane, q, j)
                    qg[j] = int32(G1[yn * w + xn])
                cont = s > s0[j] or (s == 0 and not first and 0 <= x - dx < w)
                if s == s0[j] and cont:  # the band's first row: from the previous band's last
                    pb = uint64((k * w + x - dx) * n)
                    for i in range(K4):
                        for b in range(4):
                            prev[j, 4 * i + b] = int32(cin[pb + uint64(4 * (lane + L * i) + b)])
                    ms[j] = min_in[k * w + x - dx]
                    gs[j] = int32(G1[(y - dy) * w + x - dx])
                mloc = int32(BIG)
                if cont:
                    p2e = p2tab[abs(g - gs[j])]
                    m = ms[j]
                    below = int32(BIG)  # (lane 0) disparity 4 (L i) - 1: lane L - 1's last of word i - 1
                    for i in range(K4):
                        word = words[i]
                        tl = from_lane(prev[j, 4 * i + 3], (lane + L - 1) % L, scratch, wi, lane)
                        tu = from_lane(prev[j, 4 * i], (lane + 1) % L, scratch, wi, lane)
                        tn = int32(BIG)
                        if i + 1 < K4:
                            tn = from_lane(prev[j, 4 * i + 4], (lane + 1) % L, scratch, wi, lane)
                        lo = tl if lane > 0 else below
                        hi3 = tu if lane < L - 1 else tn
                        below = tl
                        for b in range(4):
                            c = int32((word >> uint32(8 * b)) & uint32(0xFF))
                            pc = prev[j, 4 * i + b]
                            hi = prev[j, 4 * i + b + 1] if b < 3 else hi3
                            v = agg.sgm_value(c, pc, lo, hi, m, p1i, p2e)
                            lo = pc
                            prev[j, 4 * i + b] = v
                            mloc = min(mloc, v)
                else:  # a path's first pixel: L = C
                    for i in range(K4):
                        word = words[i]
                        for b in range(4):
                            v = int32((word >> uint32(8 * b)) & uint32(0xFF))
                            prev[j, 4 * i + b] = v
                            mloc = min(mloc, v)
                mloc = warp_min(mloc, scratch, wi, lane)
                ms[j] = mloc
                gs[j] = g
                add(S1, uint64(y * w + x) * per, lane, prev, j)
                if s == rows - 1:
                    pb = uint64((k * w + x) * n)
                    for i in range(K4):
                        for b in range(4):
                            cout[pb + uint64(4 * (lane + L * i) + b)] = prev[j, 4 * i + b]
                    if lane == 0:
                        mout[k * w + x] = mloc
                if x + dx < 0 or x + dx >= w:
                    live[j] = 0  # the walk leaves the image at the side
    return kernel
