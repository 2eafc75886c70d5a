"""Aggregation kernels (stages/aggregate.py on the GPU): box aggregation of a uint8 volume, and the SGM path-line kernel."""
import functools
import os

from numba import cuda, int32, uint16, uint32, uint64

from ...stages import aggregate as _agg
from .common import (stable_cache_key, _REGS, BIG, CACHE, LLVM_INLINE, SGM_K, SGM_LANES, SGM_WARPS, SIM, _volume_index, atomic_add_at,
                     auto_on_off, byte_perm, from_lane_above, from_lane_below, group_min_for, min_u16x2_for, warp_min,
                     device_twins)

agg = device_twins(_agg)  # the stage's shared arithmetic, as device functions

@cuda.jit(cache=CACHE)
def box_u8_x_kernel(C, r, out):
    i = cuda.grid(1)
    h, w, n = C.shape
    if i < h * n:
        d = i % n
        y = i // n
        acc = int32(0)
        for k in range(-r, r + 1):
            acc += C[y, min(max(k, 0), w - 1), d]
        for x in range(w):
            out[y, x, d] = acc
            acc += int32(C[y, min(x + r + 1, w - 1), d]) - int32(C[y, max(x - r, 0), d])


@cuda.jit(cache=CACHE)
def box_u8_y_kernel(T, r, out):
    i = cuda.grid(1)
    h, w, n = T.shape
    if i < w * n:
        d = i % n
        x = i // n
        area = (2 * r + 1) * (2 * r + 1)
        acc = int32(0)
        for k in range(-r, r + 1):
            acc += T[min(max(k, 0), h - 1), x, d]
        for y in range(h):
            out[y, x, d] = (acc + area // 2) // area
            acc += T[min(y + r + 1, h - 1), x, d] - T[max(y - r, 0), x, d]


def _group_exchange(G, redux=False):
    """Min over a group of G lanes and the edge values of the neighbouring lanes, for
    groups of G aligned lanes inside a warp (several path lines per warp); redux: see
    group_min_for."""
    if SIM:
        return warp_min, from_lane_below, from_lane_above

    group_min = group_min_for(G, redux)

    @cuda.jit(device=True, inline=True)
    def below(v, scratch, w, gl):
        r = cuda.shfl_up_sync(0xFFFFFFFF, v, 1)
        return r if gl > 0 else int32(BIG)

    @cuda.jit(device=True, inline=True)
    def above(v, scratch, w, gl):
        r = cuda.shfl_down_sync(0xFFFFFFFF, v, 1)
        return r if gl < G - 1 else int32(BIG)

    return group_min, below, above


def _make_sgm_kernel(G, K, vec, atomic, PF, first_store=False, packed=False, cc=(0, 0), redux=False, full=False,
                     split=False):
    """The SGM line kernel for groups of G lanes, each lane holding K disparities in
    registers (a group covers G * K disparities). `vec`: the cost volume is read as
    uint32 words (4 costs) and the path volume written as uint64 words (4 values),
    which needs D % 4 == 0 and K % 4 == 0. PF: how many pixels ahead of a walk its
    costs and guide values are loaded (SGM_PREFETCH). first_store (atomic, and only one
    direction pair launched alone, whose lines cover every pixel once): the first of a
    line's two walks to reach a pixel stores its costs there and the second adds, so the
    sum needs no zeroing and is read once fewer (CUDA backend: the horizontal pair before
    the bands, and the vertical pair of 4 paths apart: pairs_apart). packed (vec): a
    lane's path costs kept as pairs of uint16 in uint32 words, two disparities an
    instruction (SGM_PACKED). redux: the group's minimum by one redux.sync (SGM_REDUX).
    full: G * K == D, every lane's K disparities exist (SGM_FULL). split: a line a warp,
    stored where first (SGM_SPLIT): the steps where both walks store, those where both
    add and the round between run as three loops, without each step's tests.

    The two walks of a line step together: the forward walk reaches position i at step
    i, the backward one at step length - 1 - i, so the forward walk is first where 2 s <=
    length - 1 (at the middle both arrive at once, the forward one first in program
    order) and the backward one where 2 s < length - 1; a lane writes the same words for
    both walks, so the add follows its own store.

    The volumes and the guide are flat: a walk keeps the flat index of its pixel and of
    its lane's first word there, and steps them by constant strides (unsigned indices,
    so no per-access multiply or negative-index fix-up)."""
    if not 1 <= PF <= 4:
        raise ValueError(f"prefetch depth {PF}: the line kernel's loop is unrolled for 1 to 4")
    R = PF + 1  # rows of a walk's queue
    GROUPS = 1 if SIM else 32 // G  # path lines per warp
    # a warp (the simulator: a block) walks one line, so its steps end with that line's and
    # every step is on it (the simulator runs the split loop too: CI's tests of the pair
    # stored where first go through it)
    ONE_LINE = GROUPS == 1
    SPLIT = split and ONE_LINE and first_store and atomic
    group_min, from_below, from_above = _group_exchange(G, redux)

    K4 = K // 4  # words per lane (vec)
    KW = K4 if vec else K  # raw words of a lane's costs at one pixel

    KP = K // 2  # PACKED: a lane's uint32 words of two path costs
    EDGE2 = uint32(_agg.EDGE * 0x10001)  # PACKED: both halves beyond the ends (EDGE + P1 < 65536)
    PACKED = packed and vec  # (vec: on a GPU, with K % 4 == 0)
    prmt = byte_perm() if PACKED else None
    min2 = min_u16x2_for(cc) if PACKED else None

    @cuda.jit(device=True, inline=True)
    def fetch(C1, off, nk, q, i):
        """Start the loads of one pixel's costs into row i of the queue q, as they are
        stored (vec: K4 uint32 words of 4 costs, else K costs); off is the flat index of
        this lane's first word there; nk of its K disparities exist (tested even where
        `full`: SGM_FULL)."""
        if vec:
            for t in range(K4):
                q[i, t] = C1[uint64(off + t)] if 4 * t < nk else uint32(0)
        else:
            for j in range(K):
                q[i, j] = uint32(C1[uint64(off + j)]) if j < nk else uint32(0)

    @cuda.jit(device=True, inline=True)
    def take(q, gq, c, u):
        """The pixel in row u of the queue (a ring of R = PF + 1 rows: pixel i in row i % R,
        u a constant where the walk's loop is unrolled): its costs into c (unpacked);
        returns its guide value. PACKED: the costs as pairs of uint16 (c[2t], c[2t + 1]
        from word t). The rows are never moved: a move waits for the load into the row it
        reads, so a queue shifted a row a step gives every load one step whatever PF; and
        the previous pixel's guide value stays in its row until this step has read it
        (PF rows would need a copy of it, a move that waits for the next load)."""
        if PACKED:
            for t in range(K4):
                word = q[u, t]
                c[2 * t] = prmt(word, uint32(0), uint32(0x4140))  # bytes 0, 1 -> the low halves of two
                c[2 * t + 1] = prmt(word, uint32(0), uint32(0x4342))
        elif vec:
            for t in range(K4):
                word = q[u, t]
                for b in range(4):
                    c[4 * t + b] = int32((word >> uint32(8 * b)) & uint32(0xFF))
        else:
            for j in range(K):
                c[j] = int32(q[u, j])
        return gq[u]

    TRANSPOSE = vec and atomic and K4 > 1
    TW = 32 * K4 if TRANSPOSE else 1  # words of a warp's transpose buffer

    @cuda.jit(device=True, inline=True)
    def pack(v, i):
        """Values 4i..4i+3 of v (each under 65536) as one uint64 word of four 16-bit
        fields, 4i lowest: the word added into the packed uint16 sum volume (no carry
        crosses a field, as a sum never exceeds 65535)."""
        return (uint64(v[4 * i] & 0xFFFF) | (uint64(v[4 * i + 1] & 0xFFFF) << uint64(16))
                | (uint64(v[4 * i + 2] & 0xFFFF) << uint64(32)) | (uint64(v[4 * i + 3] & 0xFFFF) << uint64(48)))

    @cuda.jit(device=True, inline=True)
    def pack_p(v, i):
        """pack's twin for PACKED values: words 2i and 2i + 1 (two costs each) as one uint64."""
        return uint64(v[2 * i]) | (uint64(v[2 * i + 1]) << uint64(32))

    @cuda.jit(device=True, inline=True)
    def store(S1, off, nk, v, active, put, tw, w, gl, grp, per):
        """This lane's values of one pixel into S1 (off: its first element there), when
        `active` (called by every lane of the warp). atomic: added to the sum volume
        (uint64 words of four 16-bit sums, or uint32 sums), else stored in a direction
        volume. TRANSPOSE: a lane's K4 words are consecutive in S1, so a warp's atomic
        touched a sector per lane; the group's words go through shared memory and
        consecutive lanes add consecutive words. put (first_store): stored, not added."""
        if TRANSPOSE:
            g0 = grp * G * K4
            for i in range(K4):
                tw[w, g0 + gl * K4 + i] = pack_p(v, i) if PACKED else pack(v, i)
            cuda.syncwarp(0xFFFFFFFF)
            if active:
                base = off - gl * K4  # the pixel's first word
                for i in range(K4):
                    j = i * G + gl
                    if j < per:
                        if put:
                            S1[uint64(base + j)] = tw[w, g0 + j]
                        else:
                            atomic_add_at(S1, uint64(base + j), tw[w, g0 + j])
            cuda.syncwarp(0xFFFFFFFF)
        elif active:
            if vec:
                for i in range(K4):
                    if full or 4 * i < nk:
                        word = pack_p(v, i) if PACKED else pack(v, i)
                        if atomic and not put:
                            atomic_add_at(S1, uint64(off + i), word)
                        else:
                            S1[uint64(off + i)] = word
            else:
                for j in range(K):
                    if full or j < nk:
                        if atomic and not put:
                            atomic_add_at(S1, uint64(off + j), uint32(v[j]))
                        else:
                            S1[uint64(off + j)] = v[j]

    @cuda.jit(device=True, inline=True)
    def start(C1, G1, p, pstep, off, stride, length, nk, c, q, gq):
        """The first pixel's costs into c (flat index p, lane offset off; the next pixel
        is at p + pstep, off + stride), and the loads of the next PF pixels' costs and
        guide values started into the queue (q, gq: pixel i in row i)."""
        gq[0] = int32(0)
        if length > 0:
            fetch(C1, off, nk, q, 0)
            gq[0] = int32(G1[uint64(p)])
            take(q, gq, c, 0)
        for i in range(1, R):
            if i < length:
                fetch(C1, off + i * stride, nk, q, i)
                gq[i] = int32(G1[uint64(p + i * pstep)])

    @cuda.jit(device=True, inline=True)
    def ahead(C1, G1, p, pstep, off, stride, s, length, nk, q, gq, u):
        """At step s (row u): the loads of the pixel PF steps ahead started into its row,
        the previous pixel's."""
        if int32(s + PF) < length:
            fetch(C1, off + PF * stride, nk, q, (u + PF) % R)
            gq[(u + PF) % R] = int32(G1[uint64(p + PF * pstep)])

    @cuda.jit(device=True, **LLVM_INLINE)
    def begin(C1, G1, S1, p, pstep, off, stride, length, nk, cur, c, q, gq, scratch, w, gl, tw, grp, per, put):
        """First pixel of a path: L = C there (start). Returns the min of L over the group."""
        start(C1, G1, p, pstep, off, stride, length, nk, c, q, gq)
        m = int32(BIG)
        for j in range(K):
            v = c[j] if full or j < nk else int32(BIG)
            cur[j] = v
            m = min(m, v)
        store(S1, off, nk, cur, length > 0, put, tw, w, gl, grp, per)
        return group_min(m, scratch, w, gl)

    @cuda.jit(device=True, **LLVM_INLINE)
    def advance(u, C1, G1, p1, p2tab, S1, p, pstep, off, stride, s, length, nk, m, prev, cur,
                c, q, gq, scratch, w, gl, tw, grp, per, put):
        """Step s of a path, at the pixel (p, off): cur = SGM update of prev with the
        costs loaded PF steps ago (row u of the queue q, gq); starts the loads of the pixel PF
        steps ahead. A group past the end of its line computes but loads and stores
        nothing (the shuffles need every lane of the warp). Returns the min of cur over
        the group."""
        for j in range(K):
            prev[j] = cur[j]
        g = take(q, gq, c, u)
        p2e = p2tab[uint32(abs(int32(g - gq[(u + PF) % R])))]  # penalty2 of every grey step, tabulated by the host
        ahead(C1, G1, p, pstep, off, stride, s, length, nk, q, gq, u)
        lo0 = from_below(prev[K - 1], scratch, w, gl)
        hiK = from_above(prev[0], scratch, w, gl)
        mloc = int32(BIG)
        for j in range(K):
            lo = prev[j - 1] if j > 0 else lo0
            hi = prev[j + 1] if j + 1 < K else hiK
            v = agg.sgm_value(c[j], prev[j], lo, hi, m, p1, p2e)
            v = v if full or j < nk else int32(BIG)
            cur[j] = v
            mloc = min(mloc, v)
        store(S1, off, nk, cur, s < length, put, tw, w, gl, grp, per)
        return group_min(mloc, scratch, w, gl)

    @cuda.jit(device=True, inline=True)
    def pair_min(v):
        return int32(min(v & uint32(0xFFFF), v >> uint32(16)))

    @cuda.jit(device=True, **LLVM_INLINE)
    def begin_p(C1, G1, S1, p, pstep, off, stride, length, nk, cur, c, q, gq, scratch, w, gl, tw, grp, per, put):
        """begin's twin for PACKED."""
        start(C1, G1, p, pstep, off, stride, length, nk, c, q, gq)
        m = EDGE2
        for j in range(KP):
            v = c[j] if full or 2 * j < nk else EDGE2
            cur[j] = v
            m = min2(m, v)
        store(S1, off, nk, cur, length > 0, put, tw, w, gl, grp, per)
        return group_min(pair_min(m), scratch, w, gl)

    @cuda.jit(device=True, **LLVM_INLINE)
    def advance_p(u, C1, G1, p1x2, p2tab, S1, p, pstep, off, stride, s, length, nk, m, prev, cur,
                  c, q, gq, scratch, w, gl, tw, grp, per, put):
        """advance's twin for PACKED: the same update, two disparities an instruction.
        Exact: every path cost is below EDGE (255 + P2), EDGE + P1 < 65536, and what is
        subtracted (the previous minimum) is at most each half it is subtracted from, so
        no half carries into or borrows from the other."""
        for j in range(KP):
            prev[j] = cur[j]
        g = take(q, gq, c, u)
        p2e = p2tab[uint32(abs(int32(g - gq[(u + PF) % R])))]  # (the previous pixel's row: read before it is reloaded)
        ahead(C1, G1, p, pstep, off, stride, s, length, nk, q, gq, u)
        below = uint32(cuda.shfl_up_sync(0xFFFFFFFF, int32(prev[KP - 1]), 1))  # its high half: L(d0 - 1)
        above = uint32(cuda.shfl_down_sync(0xFFFFFFFF, int32(prev[0]), 1))  # its low half: L(d0 + K)
        below = below if gl > 0 else EDGE2
        above = above if gl < G - 1 else EDGE2
        mx2 = uint32(m) * uint32(0x10001)
        mp2x2 = uint32(m + p2e) * uint32(0x10001)
        mloc = EDGE2
        for j in range(KP):
            a = prev[j - 1] if j > 0 else below
            b = prev[j + 1] if j + 1 < KP else above
            lo = prmt(a, prev[j], uint32(0x5432))  # (L(d - 1), L(d)) of this word's (d, d + 1)
            hi = prmt(prev[j], b, uint32(0x5432))  # (L(d + 1), L(d + 2))
            t = min2(min2(uint32(min2(lo, hi) + p1x2), prev[j]), mp2x2)
            v = uint32(uint32(c[j] + t) - mx2)
            v = v if full or 2 * j < nk else EDGE2
            cur[j] = v
            mloc = min2(mloc, v)
        store(S1, off, nk, cur, ONE_LINE or s < length, put, tw, w, gl, grp, per)
        return group_min(pair_min(mloc), scratch, w, gl)

    @cuda.jit(device=True, inline=True)
    def line_length(y, x, dx, dy, h, wd):
        steps = 1 << 30
        if dx > 0:
            steps = min(steps, (wd - 1 - x) // dx)
        elif dx < 0:
            steps = min(steps, x // (-dx))
        if dy > 0:
            steps = min(steps, (h - 1 - y) // dy)
        elif dy < 0:
            steps = min(steps, y // (-dy))
        return steps + 1

    @cuda.jit(device=True, inline=True)
    def warp_max(v):
        if SIM:
            return v
        for off in (16, 8, 4, 2, 1):
            v = max(v, cuda.shfl_xor_sync(0xFFFFFFFF, v, off))
        return v

    @cuda.jit(device=True, **LLVM_INLINE)
    def both(u, s, mode, C1, G1, p1i, p2tab, Sf, Sb, p, pb, pstep, off, offb, stride, length, nk, m, m2, wf, wb, ex):
        """Step s of a line's two walks (u = s % R: their queues' row); wf, wb: each
        walk's arrays (prev, cur, c, q, gq), ex: (scratch, w, gl, tw, grp, per) (tuples: a
        call of over 30 arguments is one Numba cannot inline). Returns the walks' new
        positions and minima."""
        prev, cur, c, qf, gqf = wf
        prev2, cur2, c2, qb, gqb = wb
        scratch, w, gl, tw, grp, per = ex
        p += pstep
        off += stride
        pb -= pstep
        offb -= stride
        twice, last = int32(2 * s), int32(length - 1)
        put_f = mode == 1 or (mode == 0 and first_store and twice <= last)
        put_b = mode == 1 or (mode == 0 and first_store and twice < last)
        m = advance_f(u, C1, G1, p1i, p2tab, Sf, p, pstep, off, stride, s, length, nk, m,
                      prev, cur, c, qf, gqf, scratch, w, gl, tw, grp, per, put_f)
        m2 = advance_f(u, C1, G1, p1i, p2tab, Sb, pb, -pstep, offb, -stride, s, length, nk, m2,
                       prev2, cur2, c2, qb, gqb, scratch, w, gl, tw, grp, per, put_b)
        return p, off, pb, offb, m, m2

    @cuda.jit(device=True, **LLVM_INLINE)
    def steps(mode, checked, s, C1, G1, p1i, p2tab, Sf, Sb, p, pb, pstep, off, offb, stride, length, maxlen, nk,
              m, m2, wf, wb, ex):
        """R steps from s (s % R == 1), the queues' rows constants: `mode` 0 (whether each
        walk stores or adds as first_store says), 1 (both store) or 2 (both add);
        `checked`: steps past maxlen skipped. Returns s + R and both()'s values."""
        p, off, pb, offb, m, m2 = both(1, s, mode, C1, G1, p1i, p2tab, Sf, Sb, p, pb, pstep, off, offb, stride,
                                       length, nk, m, m2, wf, wb, ex)
        if R > 2 and (not checked or int32(s + 1) < maxlen):
            p, off, pb, offb, m, m2 = both(2, int32(s + 1), mode, C1, G1, p1i, p2tab, Sf, Sb, p, pb, pstep, off, offb,
                                           stride, length, nk, m, m2, wf, wb, ex)
        if R > 3 and (not checked or int32(s + 2) < maxlen):
            p, off, pb, offb, m, m2 = both(3, int32(s + 2), mode, C1, G1, p1i, p2tab, Sf, Sb, p, pb, pstep, off, offb,
                                           stride, length, nk, m, m2, wf, wb, ex)
        if R > 4 and (not checked or int32(s + 3) < maxlen):
            p, off, pb, offb, m, m2 = both(4, int32(s + 3), mode, C1, G1, p1i, p2tab, Sf, Sb, p, pb, pstep, off, offb,
                                           stride, length, nk, m, m2, wf, wb, ex)
        if not checked or int32(s + R - 1) < maxlen:
            p, off, pb, offb, m, m2 = both(0, int32(s + R - 1), mode, C1, G1, p1i, p2tab, Sf, Sb, p, pb, pstep, off,
                                           offb, stride, length, nk, m, m2, wf, wb, ex)
        return int32(s + R), p, off, pb, offb, m, m2

    KA, LT = (KP, uint32) if PACKED else (K, int32)  # a lane's path costs: packed pairs or one each
    begin_f, advance_f = (begin_p, advance_p) if PACKED else (begin, advance)

    @cuda.jit(cache=CACHE, **_REGS("STEREOCLI_SGM_REGS", SGM_REGISTER_CAP.get((K, PF), 0)))
    def sgm_lines_kernel(C1, G1, h, wd, n, p1, p2table, Sd1, dirs, starts):
        """All path lines of all direction pairs in one launch, GROUPS lines per warp
        (starts[i] = (y, x, pair q), longest first). Pair q = dirs[q] = (dx, dy) walks the
        line along r and, at the same time, back along -r. `atomic`: both walks add their
        costs into the one sum volume Sd1[0] (atomic adds, so lines crossing a pixel may
        run at once; integer sums do not depend on the order); otherwise they store into
        Sd1[2q] and Sd1[2q + 1], which no other group writes, and the selection kernel
        adds the direction volumes. C1, G1, Sd1[k]: the cost volume (vec: as uint32
        words), the guide and the sum or path volumes (vec: as uint64 words), flat."""
        scratch = cuda.shared.array((SGM_WARPS, SGM_LANES), int32)  # the simulator's exchange
        p2tab = cuda.shared.array(256, int32)
        tw = cuda.shared.array((SGM_WARPS, TW), uint64)  # store's transpose
        for i in range(cuda.threadIdx.x, 256, cuda.blockDim.x):
            p2tab[i] = p2table[i]
        cuda.syncthreads()  # before any thread returns
        prev = cuda.local.array(KA, LT)  # the walk along r
        cur = cuda.local.array(KA, LT)
        c = cuda.local.array(KA, LT)  # costs of this pixel
        qf = cuda.local.array((R, KW), uint32)  # raw costs and guide values: the previous pixel's, the next PF
        gqf = cuda.local.array(R, int32)
        prev2 = cuda.local.array(KA, LT)  # the walk back along -r, interleaved with it
        cur2 = cuda.local.array(KA, LT)
        c2 = cuda.local.array(KA, LT)
        qb = cuda.local.array((R, KW), uint32)
        gqb = cuda.local.array(R, int32)
        tid = cuda.threadIdx.x
        if SIM:
            w, gl, grp = 0, tid, 0
        else:
            w = tid // 32
            gl = int32((tid % 32) % G)
            grp = (tid % 32) // G
        first = (cuda.blockIdx.x * SGM_WARPS + w) * GROUPS
        nlines = starts.shape[0]
        if first >= nlines:
            return  # the whole warp is idle
        line = first + grp
        valid = line < nlines
        li = line if valid else first
        p1i = int32(p1)  # a new name: rebinding p1 would unify back to int64
        if PACKED:
            p1i = int32(uint32(p1) * uint32(0x10001))
        y0 = starts[li, 0]
        x0 = starts[li, 1]
        q = starts[li, 2]
        dx = dirs[q, 0]
        dy = dirs[q, 1]
        length = int32(line_length(y0, x0, dx, dy, h, wd) if valid else 0)  # (32-bit steps and compares)
        maxlen = warp_max(length)
        d0 = gl * K
        nk = int32(n - d0)  # how many of this lane's K disparities exist
        per = n >> 2 if vec else n  # words (vec) or costs per pixel
        first_word = d0 >> 2 if vec else d0
        pstep = dy * wd + dx  # flat step of the forward walk
        stride = pstep * per
        p = y0 * wd + x0
        pb = (y0 + (length - 1) * dy) * wd + x0 + (length - 1) * dx  # the last pixel: start of the walk back
        off = p * per + first_word
        offb = pb * per + first_word
        if atomic:
            Sf, Sb = Sd1[0], Sd1[0]
        else:
            Sf, Sb = Sd1[2 * q], Sd1[2 * q + 1]
        # the two walks are independent chains: stepping them together hides each one's latency
        m = begin_f(C1, G1, Sf, p, pstep, off, stride, length, nk, cur, c, qf, gqf, scratch, w, gl, tw, grp, per,
                    first_store)
        m2 = begin_f(C1, G1, Sb, pb, -pstep, offb, -stride, length, nk, cur2, c2, qb, gqb, scratch, w, gl, tw,
                     grp, per, first_store and length > 1)
        wf = (prev, cur, c, qf, gqf)
        wb = (prev2, cur2, c2, qb, gqb)
        ex = (scratch, w, gl, tw, grp, per)
        # the loop unrolled R times: step s takes row s % R of the queues, a constant
        s = int32(1)
        if SPLIT:  # (one line a warp, storing where first: the steps where both walks store, one
            # round over the middle, the steps where both add, each without per-step tests)
            while int32(2 * (s + R - 1)) < int32(length - 1):
                s, p, off, pb, offb, m, m2 = steps(1, False, s, C1, G1, p1i, p2tab, Sf, Sb, p, pb, pstep, off, offb,
                                                   stride, length, maxlen, nk, m, m2, wf, wb, ex)
            if s < maxlen:
                s, p, off, pb, offb, m, m2 = steps(0, True, s, C1, G1, p1i, p2tab, Sf, Sb, p, pb, pstep, off, offb,
                                                   stride, length, maxlen, nk, m, m2, wf, wb, ex)
            while int32(s + R - 1) < maxlen:
                s, p, off, pb, offb, m, m2 = steps(2, False, s, C1, G1, p1i, p2tab, Sf, Sb, p, pb, pstep, off, offb,
                                                   stride, length, maxlen, nk, m, m2, wf, wb, ex)
        while s < maxlen:
            s, p, off, pb, offb, m, m2 = steps(0, True, s, C1, G1, p1i, p2tab, Sf, Sb, p, pb, pstep, off, offb,
                                               stride, length, maxlen, nk, m, m2, wf, wb, ex)

    return stable_cache_key(sgm_lines_kernel)




_SGM_KERNELS = {}
# Disparities per lane K: 4 up to 128 disparities (one to 32 lanes per line), 16 above.
# Measured on an H100 (benchmarks/gpu.py; STEREOCLI_SGM_K=4/8/16 forces K and
# STEREOCLI_SGM_REGS the register cap): at 128 disparities K = 4 capped at 64 registers
# (28 warps per SM instead of 16 for K = 8) is 13 % (KITTI) and 10 % (1080p, 8 paths)
# faster than K = 8; K = 16 wins at 256 disparities. Keyed by (K, prefetch depth): with
# many lines (depth 1, below) the kernel waits on its loads (ncu, 1920x1080/128/8: 13 of
# 18 cycles between a warp's instructions on the long scoreboard, DRAM at 62 %), and 56
# registers fit 36 warps per SM instead of 32. H100, aggregate ms of 64 / 56, two rounds
# in separate processes (sixteenth session): 1920x1080/128/8 4.196-4.196 / 4.019-4.034,
# 3840x2160/128/8 20.11-20.12 / 20.14-20.16; with depth 2 the loads ahead need the
# registers (1920x1080/128/4 2.62-2.63 / 2.99, 1242x375/128/8 1.10-1.11 / 1.38-1.39).
# K = 16 runs best uncapped (1920x1080/256/8 9.86-9.87 ms; 128, 96, 80 registers: 9.88,
# 10.15-10.19, 12.9). K = 8 with 80 registers (eighteenth session, same machine start):
# 1920x1080/256/8 9.86 -> 9.57, /256/4 5.50 -> 5.27, 3840x2160/256/8 40.6 -> 39.4, but
# 1920x1080/192/8 7.00 -> 7.52; with 72 registers no gain. Not taken.
SGM_REGISTER_CAP = {(4, 1): 56, (4, 2): 64, (4, 3): 64}
# The paths add into one sum volume (atomic adds of packed words; 2 bytes per cell)
# unless STEREOCLI_SGM_SUM=volumes: one uint16 volume per direction (16 bytes per cell
# for 8 paths), added by the selection. H100, benchmarks/gpu.py, kernel ms (aggregate +
# select) sum / volumes: 1920x1080/128/8 5.58 / 5.46, 1920x1080/256/8 11.9 / 10.3,
# 1242x375/128/8 2.06 / 2.25, 741x500/128/8 1.44 / 1.69; end to end 3840x2160/256/8
# 83 / 148 ms. The sum is read-modify-written by every path: up to 40 bytes of DRAM
# traffic per cell against 24 + 16, and the atomics run at ~2 TB/s. ncu (eighteenth
# session), DRAM read + written per cell: 1920x1080/128/8 17.5 + 11.7 (L2 hit 42 %:
# the walks that reach a row together share it), /256/8 22.7 + 15.3 (26 %), /128/4
# 11.6 + 7.7; DRAM busy 59-63 %. Computing the census costs inside the walks from the
# census strings instead of reading the volume was tried and was slower everywhere
# (1920x1080/128/8 aggregate 4.0 -> 4.6-5.8 ms, /256/8 9.9 -> 20.1): 8 Hamming
# distances a cell instead of one byte loaded, 95 registers, and a lane's consecutive
# strings made every load touch a cache line per lane (README, GPU speed).
SGM_ATOMIC = os.environ.get("STEREOCLI_SGM_SUM", "atomic") == "atomic"
# The costs (and guide values) of the next PF pixels of a walk are loaded ahead. With
# few lines the kernel is bound by the latency of each step (under 2.4 warps per
# scheduler at 741x500, half the stalls waiting on those loads), and PF = 2 hides it;
# with many lines it is bound by memory traffic and the extra registers cost. H100,
# kernel ms (gpu.py, PF 1 -> 2): 741x500/64/8 0.70 -> 0.49, 741x500/128/4 0.83 ->
# 0.58, 1242x375/128/8 1.37 -> 1.11, 1920x1080/128/4 2.95 -> 2.63, but
# 1920x1080/128/8 4.21 -> 4.42 and no change at 1920x1080/256 or 3840x2160; PF = 3
# gave what 2 did, and PF = 4 was slower everywhere. So PF = 2 up to
# SGM_PREFETCH_LINES_PER_SM path lines per SM (1920x1080 with 8 paths has 68 on an
# H100, with 4 paths 23). STEREOCLI_SGM_PREFETCH=1|2|3 forces a depth.
# (Until the twenty-fifth session a walk's queue was shifted a row a step: that move waits
# for the load into the row it reads, so every load had one step whatever PF, and ncu on
# the horizontal pair alone at 1920x1080/128 put 47 % of the warps' stalls on the guide
# value's move. The queue is now a ring of PF + 1 rows, the loop unrolled PF + 1 times.
# H100, SGM ms, shifted / ring, two rounds: 1920x1080/128/4 2.585 / 2.51-2.52,
# 1242x375/128/4 0.87 / 0.74, 741x500/64/8 0.455 / 0.40. With K = 8 the ring at depth 2 was
# slower (1920x1080/128/8 2.97 / 3.02; depth 1: 2.96), so K > 4 takes depth 1. The step
# functions the unrolled loop calls are inlined by LLVM (LLVM_INLINE): with Numba's IR
# inlining the kernel took about 11 s to compile at depth 2, now 3.3 s.)
# With the ring, depth 4 (uncapped registers: 70 at sm_90) where the lines make at most
# SGM_PREFETCH_DEEP_WARPS_PER_SM warps per SM. H100, gpu.py kernel ms, depth 2 / 4, two
# rounds alternated with the code before (twenty-sixth session): 741x500/64/8 (15
# warps a SM) 0.514-0.516 / 0.482-0.484, 741x500/128/4 0.63 / 0.605, 1242x375/128/4
# 0.949-0.950 / 0.906-0.907, 1242x375/128/8 (its horizontal pair) 0.939-0.945 /
# 0.917-0.918; at 741x500/128/8 (30 warps a SM) depth 4 was slower (0.727-0.739 /
# 0.784-0.793), so depth 2 stays there.
SGM_PREFETCH = int(os.environ.get("STEREOCLI_SGM_PREFETCH", "0"))
SGM_PREFETCH_LINES_PER_SM = 40
SGM_PREFETCH_DEEP_WARPS_PER_SM = int(os.environ.get("STEREOCLI_SGM_PREFETCH_DEEP", "20"))
# The horizontal pair at 129-256 disparities (K = 8, a line a warp) before the bands (it
# stores where it comes first) at depth 2, its loop in three parts (SGM_SPLIT). H200,
# gpu_variants kernel ms, depth 1 / 2, three rounds
# (forty-eighth session): 1920x1080/256/8 5.24-5.28 / 5.14-5.16, 3840x2160/256/8
# 18.93 / 18.78-18.95; at 128 disparities (16 lanes of 8, two lines a warp) depth 2 stays
# slower (1920x1080/128/8 2.98 / 3.04), so only where a warp walks one line. On a later
# machine start, depth 1 / the rule here: 5.24-5.26 / 5.13-5.14, 18.96-19.20 / 18.94-19.06,
# 1920x1080/128/8 2.984-2.989 / 2.985-2.989.
SGM_PREFETCH_K8_WARP = 2
# On Hopper and later (sm_90: the one-instruction min.u16x2; measured only there), a
# lane's path costs as pairs of uint16 in uint32 words (vec): the update two
# disparities an instruction (PTX min.u16x2 on Hopper, prmt for the neighbours' pairs),
# the costs unpacked and the sums packed by byte permutes. The main loop's SASS (sm_90,
# K = 4) 197 -> 174 instructions a step of both walks. H100, SGM ms unpacked / packed,
# two rounds (twenty-fourth session): 1920x1080/128/4 2.627 / 2.595-2.614 (the
# horizontal pair alone 1.545 / 1.493), 1920x1080/256/4 4.85 / 4.56-4.59, 1242x375/128/4
# 0.94-0.95 / 0.92-0.93, 1920x1080/256/8 5.76-5.78 / 5.72-5.73. The walks are bound by
# their dependent steps (ncu, the horizontal pair alone at 1920x1080/128: 2 warps a
# scheduler, 6.5 cycles between a warp's instructions, issue 31 %), not by the loads
# (prefetch depth 2 -> 6: 1.55 -> 1.50 ms; but the queue's moves then gave every load
# one step whatever the depth: see SGM_PREFETCH) nor by the atomics (plain stores for
# the first walk to reach a pixel: no faster). STEREOCLI_SGM_PACKED=0|1.
SGM_PACKED = os.environ.get("STEREOCLI_SGM_PACKED", "1") == "1"
# A line's minimum over its 32 lanes by one redux.sync (compute capability 8.0 and up)
# instead of five shuffles and minima, for K = 4 (the lines of 4 paths and of the
# smaller sizes) and K = 8 in whole-warp lines (below). H100, SGM ms shuffles / redux, two rounds (twenty-fifth session, with
# the queue still shifted a row a step): 1920x1080/128/4 2.59 / 2.55-2.56,
# 1242x375/128/4 0.87 / 0.81. Not for groups of fewer lanes (a mask per group: 741x500/64/8
# 0.45 -> 0.74, 1920x1080/128/8 with K = 8 for the horizontal pair 2.97 -> 3.33, the
# selection's groups 0.38 -> 0.44 ms); K = 8 at 256 was slower then (3840x2160/256/8 22.4
# -> 22.7), on the loop of that session. STEREOCLI_SGM_REDUX=0 turns it off.
SGM_REDUX = os.environ.get("STEREOCLI_SGM_REDUX", "1") == "1"
# K = 8 (a warp a line at 256: the horizontal pair before the bands) takes it too since
# the forty-ninth session: with the split loop and two pixels prefetched the H100's
# figure above no longer holds. H200, gpu_variants kernel ms, three rounds alternated in
# one process, K = 4 only / up to 8: 1920x1080/256/8 5.169-5.190 / 5.113-5.136,
# 3840x2160/256/8 19.01-19.26 / 18.91-18.94 (forty-eighth session, before the depth of
# two: 5.24-5.28 / 5.18-5.21; 1920x1080/128/8, K = 8 in half-warp lines, does not take
# it). The largest K that takes it (gpu_variants varies it); K below 4 never does.
SGM_REDUX_MAX_K = 8
# Where a group's lanes hold exactly the disparities (G * K == D: 128 in 32 lanes of 4, 256
# in 16 of 16, ...), the line kernel leaves out the tests of which disparities exist
# (`full`); and its step counters and compares are 32-bit. The loop's SASS (ptxas 12.9,
# sm_90) 836 -> 760 instructions for the 4-path horizontal pair at 128 (K = 4, five steps
# unrolled), 818 -> 762 at 64 (G = 16), 540 -> 490 for the 8-path pair at 128 (K = 8).
# The loads of the costs keep their test: without it ptxas loaded each into a spare
# register and moved it into its queue row under a predicate, and the move waits for the
# load (the queue's rows are meant to be filled PF steps before they are read; H200,
# kernel ms, 741x500/128/4 0.50 -> 0.68, 1920x1080/128/4 2.25 -> 2.78). H200, gpu_variants
# kernel ms, the code before / after, two rounds alternated in separate processes
# (forty-seventh session): 741x500/64/8 0.449-0.450 / 0.442, 741x500/128/4 0.503-0.504 /
# 0.496-0.497, 1242x375/128/4 0.761-0.765 / 0.753-0.755, 1242x375/128/8 0.825-0.827 / 0.820,
# 1920x1080/128/4 2.240-2.279 / 2.222-2.228, 1920x1080/256/8 5.442-5.449 / 5.416-5.418,
# 3840x2160/256/8 19.06-19.14 / 18.99-19.08. STEREOCLI_SGM_FULL=0 keeps the tests.
SGM_FULL = os.environ.get("STEREOCLI_SGM_FULL", "1") == "1"
# Where a warp walks one line and the first walk to reach a pixel stores (the horizontal
# pair before the bands, G = 32: 128 disparities in lanes of 4, 256 in lanes of 8), the
# loop runs in three parts: the steps where both walks store, one round over the middle,
# the steps where both add; so a step tests neither which walk stores nor whether it is
# still on its line. The loop's SASS (ptxas 12.9, sm_90, 4-path pair at 128) 760 -> 611-642
# instructions. H200, gpu_variants kernel ms, the code before / after, two rounds
# alternated in separate processes (forty-eighth session): 741x500/128/4 0.494-0.495 /
# 0.481, 1242x375/128/4 0.750-0.754 / 0.726-0.728, 1920x1080/128/4 2.215-2.241 /
# 2.166-2.194, 1920x1080/128/8 2.985-2.987 / 2.988-2.989, 3840x2160/256/8 19.08-19.18 /
# 19.10-19.13. A register cap of 96 for K = 4 at prefetch depth 4 as well cost
# 1920x1080/128/4 0.04-0.06 ms: not taken. STEREOCLI_SGM_SPLIT=0 keeps one loop.
SGM_SPLIT = os.environ.get("STEREOCLI_SGM_SPLIT", "1") == "1"


# K of the horizontal pair alone (beside or before the bands: aggregate_bands) above 128
# disparities: 8, a line a warp, twice the warps of K = 16. H100, SGM ms K = 16 / 8, two
# rounds (twenty-second session): 1920x1080/256/8 (the pair first) 6.19-6.20 / 5.67-5.68,
# 3840x2160/256/8 23.44-23.50 / 22.57-22.64. At 128 disparities K = 8 only from
# SGM_HORIZONTAL_K8_MIN_CELLS (K = 4 / 8: 1920x1080/128/8 3.02 / 2.98, but
# 1242x375/128/8 0.91 / 1.01).
SGM_HORIZONTAL_K = 8
SGM_HORIZONTAL_K8_MIN_CELLS = 1 << 27

# 4 paths from SGM_PAIRS_APART_MIN_CELLS cells: the vertical pair first, alone, storing
# its costs where it comes first (no zeroed sum), then the horizontal pair adding,
# instead of one launch of both pairs into a zeroed sum. H100, SGM ms, one launch / the
# vertical pair first / the horizontal pair first (twenty-third session, the sums
# identical): 1242x375/128/4 0.89 /
# 1.08 / 1.10, 1920x1080/128/4 2.60 / 2.58 / 2.65, 1920x1080/256/4 5.42 / 4.72 / 5.02,
# 3840x2160/256/4 21.4 / 18.5 / 18.5. With the walks' queue a ring (twenty-sixth
# session) the pairs apart won at 1920x1080/128/4 too, which has 2^27.98 cells and ran
# as one launch below 2^28: H100, gpu.py, two rounds alternated, aggregate ms one launch
# / apart 2.524-2.532 / 2.130-2.131 (kernels 3.27-3.28 / 2.879); still not at the KITTI
# size (1242x375/128/4 0.701-0.703 / 0.744-0.747) nor at 741x500/128/4 (0.435-0.436 /
# 0.556-0.557). So from 2^27 cells. STEREOCLI_SGM_PAIRS_APART=auto|on|off.
# Tried with the pairs apart and not kept (twenty-ninth session, H100, 1920x1080/128/4;
# README): the horizontal pair selecting each pixel where its second walk completes the
# sum (no selection kernel, nothing written there): pair + selection 3.53-3.78 ms
# against 1.24 + 0.38, a whole warp doing one pixel's minima, uniqueness and finish
# where the selection kernel's warp does eight; and, since a pair alone owns its
# pixels, plain loads (issued ahead with the costs), adds and stores instead of the
# atomic adds: aggregation 2.125 -> 3.717 ms.
SGM_PAIRS_APART = os.environ.get("STEREOCLI_SGM_PAIRS_APART", "auto")
SGM_PAIRS_APART_MIN_CELLS = 1 << 27


def pairs_apart(paths, cells):
    """Whether SGM over 4 paths and `cells` cells (W x H x D) runs the vertical pair
    first, then the horizontal pair (SGM_PAIRS_APART), where the vertical pair does not
    run in bands (aggregate_bands.use_bands4, which the backend asks first)."""
    return paths == 4 and auto_on_off(SGM_PAIRS_APART, cells >= SGM_PAIRS_APART_MIN_CELLS)


def _line_k(ndisp, horizontal, cells):
    """Disparities per lane of the SGM line kernel (see _SGM_KERNELS, SGM_HORIZONTAL_K;
    the horizontal pair's K up to the disparities a warp's lanes of it hold)."""
    if horizontal and ndisp <= 32 * SGM_HORIZONTAL_K and (
            ndisp > 128 or (ndisp == 128 and cells >= SGM_HORIZONTAL_K8_MIN_CELLS)):
        return SGM_HORIZONTAL_K
    return 4 if ndisp <= 128 else 16


def sgm_shape(ndisp, horizontal=False, cells=0):
    """(G, K, vec) of the SGM line kernel for D disparities: G lanes per path line, K
    disparities per lane, and whether the volumes are read and added to in words (the
    cost volume as uint32 words, the sum as uint64 words of four uint16 sums).
    `horizontal`: the kernel runs the horizontal pair alone, over `cells` cells
    (SGM_HORIZONTAL_K)."""
    if SIM:
        G, K = SGM_LANES, SGM_K
    else:
        K = int(os.environ.get("STEREOCLI_SGM_K", "0")) or _line_k(ndisp, horizontal, cells)
        G = 1
        while G * K < ndisp:
            G *= 2
        if G > 32:
            raise ValueError(f"{ndisp} disparities need more than 32 lanes of {K}")
    return G, K, (not SIM) and ndisp % 4 == 0 and K % 4 == 0


def sgm_kernel_for(ndisp, lines=0, first_store=False, horizontal=False, cells=0):
    """(kernel, G, vec) for D disparities and `lines` path lines (sgm_shape), with the
    prefetch depth (SGM_PREFETCH) for that many lines; first_store: see _make_sgm_kernel;
    horizontal, cells: see sgm_shape."""
    G, K, vec = sgm_shape(ndisp, horizontal, cells)
    pf = SGM_PREFETCH
    if not pf:
        sms = _sm_count()
        pf = 1
        if K == 4 and lines <= SGM_PREFETCH_LINES_PER_SM * sms:
            pf = 4 if lines * G <= 32 * SGM_PREFETCH_DEEP_WARPS_PER_SM * sms else 2
        elif K == 8 and G == 32 and first_store:
            pf = SGM_PREFETCH_K8_WARP
    cc = (0, 0) if SIM else tuple(cuda.get_current_device().compute_capability)
    packed = SGM_PACKED and vec and cc >= (9, 0)  # (before Hopper, min.u16x2 is two minima and masks)
    redux = SGM_REDUX and not SIM and G == 32 and 4 <= K <= SGM_REDUX_MAX_K and cc >= (8, 0)
    key = (G, K, vec, SGM_ATOMIC, pf, first_store and SGM_ATOMIC, packed, cc, redux, SGM_FULL and G * K == ndisp,
           SGM_SPLIT)
    if key not in _SGM_KERNELS:
        _SGM_KERNELS[key] = _make_sgm_kernel(*key)
    return _SGM_KERNELS[key], G, vec


@functools.cache
def _sm_count():
    return 132 if SIM else cuda.get_current_device().MULTIPROCESSOR_COUNT


def sgm_lines_per_block(G):
    return 1 if SIM else SGM_WARPS * (32 // G)


@cuda.jit(cache=CACHE)
def sgm_sum4_kernel(Sp4, S4):
    """The direction volumes added four disparities at a time as packed uint64 words:
    exact, because a sum never exceeds 65535 (config bounds paths * (255 + P2)), so no
    carry crosses from one 16-bit value into the next."""
    npairs, h, w, n4 = Sp4.shape
    y, x, wi, inside = _volume_index(w, n4)
    if inside:
        acc = uint64(0)
        for q in range(npairs):
            acc += Sp4[q, y, x, wi]
        S4[y, x, wi] = acc


@cuda.jit(cache=CACHE)
def sgm_sum_kernel(Sp, S):
    npairs, h, w, n = Sp.shape
    y, x, d, inside = _volume_index(w, n)
    if inside:
        acc = int32(0)
        for q in range(npairs):
            acc += Sp[q, y, x, d]
        S[y, x, d] = acc


# ---------------------------------------------------------------- More Global Matching
# One pass (stages/aggregate.py: mgm_plan) per launch. A block takes a tile of
# MGM_TILE consecutive lines (the next tile in the pass's order, from a ticket counter),
# a warp per line, a lane per K disparities in registers. The warps walk their lines
# skewed: at step s warp r is at pixel s - skew * r, so the neighbours it needs on the
# previous line (warp r - 1's pixels k, or k - 1 and k + 1 for a cone pass, skew 2)
# are final in shared memory, behind one block barrier per step; the neighbour on the
# same line, the previous pixel, is still in registers. A tile's first line reads the
# previous tile's last line from global memory (past L1: ld.global.cg, as L1 is not
# coherent between SMs) once that tile has published (progress, every MGM_PUBLISH
# pixels, after a fence) that it is far enough. Tickets are handed out in order, so a
# block waits only for blocks that already run (no deadlock whatever the grid). The
# simulator runs a lane per line (K up to MGM_K disparities) and tiles of 3 lines.
# A pass adds its costs into the sum S with 32-bit atomic adds (a uint16 value shifted
# into its half of the word: no carry crosses, as a sum never exceeds 65535), so the
# passes run at once on their own streams, each with its own tiles' last lines (Lg,
# Mg: one line per tile, indexed by tile and step). A wavefront leaves most of the GPU
# idle; 4 or 8 of them side by side fill more of it.
MGM_LANES = SGM_LANES
MGM_TILE = 3 if SIM else int(os.environ.get("STEREOCLI_MGM_TILE", "8"))  # (tuning knobs)
MGM_PUBLISH = int(os.environ.get("STEREOCLI_MGM_PUBLISH", "4"))
MGM_RING = 4  # a line's last pixels kept in shared memory for the next line
MGM_K = 16
MGM_MAX_DISPARITIES = MGM_LANES * MGM_K
_MGM_EDGE = _agg.EDGE
_MGM_KERNELS = {}

if SIM:  # (a lane per line there: no warp to synchronise)
    @cuda.jit(device=True)
    def _l2(a, i):
        return a[i]

    @cuda.jit(device=True)
    def _syncwarp():
        pass
else:
    @cuda.jit(device=True, inline=True)
    def _syncwarp():
        cuda.syncwarp(0xFFFFFFFF)

    @cuda.jit(device=True, inline=True)
    def _l2(a, i):
        """a[i] from L2 (another block wrote it during this launch)."""
        return cuda.ldcg(a, i)


def mgm_kernel_for(ndisp):
    """(kernel, K) for D disparities: the smallest K of 1, 2, 4, 8, 16 with 32 lanes (the
    simulator: one lane) covering them."""
    K = 1
    while K * MGM_LANES < ndisp:
        K *= 2
    if K > MGM_K:
        raise ValueError(f"{ndisp} disparities need more than {MGM_K} per lane")
    if K not in _MGM_KERNELS:
        _MGM_KERNELS[K] = _make_mgm_kernel(K)
    return _MGM_KERNELS[K], K


def _make_mgm_kernel(K):
    T, R, P = MGM_TILE, MGM_RING, MGM_PUBLISH
    ROW = MGM_LANES * K + 2  # a ring row: the disparities of 32 lanes of K, EDGE-padded
    RING, RMIN = T * R * ROW, T * R  # (shared array sizes must be plain constants)

    @cuda.jit(device=True, inline=True)
    def geometry(k, u, U, V, row_major, sv, adu, adv, bdu, bdv):
        """Pixel k of line u in the pass's order, and its neighbours a and b (y, x, inside)."""
        v = k if sv > 0 else V - 1 - k
        ua, va, ub, vb = u + adu, v + adv, u + bdu, v + bdv
        return ((u if row_major else v), (v if row_major else u),
                0 <= ua < U and 0 <= va < V, (ua if row_major else va), (va if row_major else ua),
                0 <= ub < U and 0 <= vb < V, (ub if row_major else vb), (vb if row_major else ub))

    @cuda.jit(device=True, inline=True)
    def ring_term(ring, rmin, r1, slot, c0, n, p1, p2, t):
        """t[j] = SGM's term from warp r1's pixel in ring slot `slot` (flat shared arrays,
        unsigned indices: no negative-index fix-up)."""
        q = uint32(r1 * R + slot)
        m = rmin[q]
        o = q * uint32(ROW) + uint32(c0)
        for j in range(K):
            if c0 + j < n:
                t[j] = agg.sgm_value(int32(0), int32(ring[o + uint32(j + 1)]), int32(ring[o + uint32(j)]),
                                     int32(ring[o + uint32(j + 2)]), m, p1, p2)

    @cuda.jit(device=True, inline=True)
    def reg_term(Lq, m, p1, p2, t, scratch, r, lane):
        """t[j] = SGM's term from a pixel whose L this warp holds in registers (EDGE beyond
        the disparities), its minimum m; the lanes' edge values through shuffles."""
        below = from_lane_below(Lq[K - 1], scratch, r, lane)
        above = from_lane_above(Lq[0], scratch, r, lane)
        for j in range(K):
            lo = Lq[j - 1] if j > 0 else below
            hi = Lq[j + 1] if j < K - 1 else above
            t[j] = agg.sgm_value(int32(0), Lq[j], lo, hi, m, p1, p2)

    @cuda.jit(device=True, inline=True)
    def load_line(Lg, o, c0, n, Lq):
        """Lq[j] = the previous tile's L at flat offset o (+ d), EDGE beyond the disparities."""
        for j in range(K):
            d = c0 + j
            Lq[j] = int32(_l2(Lg, uint64(o + d))) if d < n else int32(_MGM_EDGE)

    @cuda.jit(cache=CACHE)
    def kernel(C, guide, h, w, n, p1, p2tab, S32, Lg, Mg, progress, ticket, row_major, su, sv, adu, adv, bdu, bdv):
        """C, guide flat (h * w * n, h * w), S32 the sum volume's uint16 values in pairs
        (uint32 words, added to atomically); Lg, Mg: each tile's last line's L and minima
        at [tile, step (, d)]. Indexed with unsigned offsets."""
        U = h if row_major else w
        V = w if row_major else h
        ring = cuda.shared.array(RING, uint16)  # [warp, slot, 1 + d]: each warp's last pixels' L
        rmin = cuda.shared.array(RMIN, int32)
        tile_id = cuda.shared.array(1, int32)
        scratch = cuda.shared.array((T, 32), int32)  # the simulator's lane exchange
        tid = cuda.threadIdx.x
        r = tid // MGM_LANES  # this warp's line in the tile
        lane = tid % MGM_LANES
        if tid == 0:
            tile_id[0] = cuda.atomic.add(ticket, 0, 1)
        for q in range(tid, RING, T * MGM_LANES):
            ring[q] = _MGM_EDGE
        cuda.syncthreads()
        tile = tile_id[0]
        i = tile * T + r  # the line's index in the pass's order
        u = i if su > 0 else U - 1 - i
        cone = adu != 0
        skew = 2 if cone else 1
        last = r == T - 1 or i == U - 1  # the tile's last line: to global memory for the next tile
        glob = r == 0 and i > 0 and i < U  # the previous line is the previous tile's last
        c0 = lane * K
        La = cuda.local.array(K, int32)  # this line's L at the previous pixel
        ta = cuda.local.array(K, int32)
        tb = cuda.local.array(K, int32)
        # What the warp's next pixel reads from global memory, loaded a step ahead (their
        # latency hides behind the barrier): C, S (of the earlier passes), the grey levels
        # of the pixel and its neighbours, and (glob) the neighbours' L and minima.
        cn = cuda.local.array(K, int32)
        pa = cuda.local.array(K, int32)
        pb = cuda.local.array(K, int32)
        for j in range(K):
            La[j] = int32(_MGM_EDGE)
        gn = int32(0)
        gan = int32(0)
        gbn = int32(0)
        man = int32(0)
        mbn = int32(0)
        m = int32(0)
        known = int32(0)  # (glob, lane 0) the previous tile's progress seen so far
        for s in range(-1, V + skew * (T - 1)):
            k = s - skew * r
            if 0 <= k < V and i < U:
                y, x, has_a, ya, xa, has_b, yb, xb = geometry(k, u, U, V, row_major, sv, adu, adv, bdu, bdv)
                p2a = p2tab[abs(gn - gan)] if has_a else int32(0)
                p2b = p2tab[abs(gn - gbn)] if has_b else int32(0)
                if has_a:
                    if not cone:  # the previous pixel of this line
                        reg_term(La, m, p1, p2a, ta, scratch, r, lane)
                    elif glob:
                        reg_term(pa, man, p1, p2a, ta, scratch, r, lane)
                    else:
                        ring_term(ring, rmin, r - 1, (k + adv * sv) % R, c0, n, p1, p2a, ta)
                if has_b:
                    if glob:
                        reg_term(pb, mbn, p1, p2b, tb, scratch, r, lane)
                    else:
                        ring_term(ring, rmin, r - 1, (k + bdv * sv) % R, c0, n, p1, p2b, tb)
                mn = int32(BIG)
                slot = k % R
                base = (y * w + x) * n
                for j in range(K):
                    d = c0 + j
                    val = int32(_MGM_EDGE)
                    if d < n:
                        val = agg.mgm_value(cn[j], ta[j], tb[j], has_a, has_b)
                        cell = uint64(base + d)
                        cuda.atomic.add(S32, cell >> uint64(1), uint32(val) << uint32((cell & uint64(1)) * uint64(16)))
                        ring[uint32((r * R + slot) * ROW + d + 1)] = val
                        if last:
                            Lg[uint64((tile * V + k) * n + d)] = val
                        mn = min(mn, val)
                    La[j] = val
                m = warp_min(mn, scratch, r, lane)
                if lane == 0:
                    rmin[uint32(r * R + slot)] = m
                if last:
                    publish = (k + 1) % P == 0 or k == V - 1
                    if lane == 0:
                        Mg[uint64(tile * V + k)] = m
                    if publish:
                        cuda.threadfence()
                        _syncwarp()
                        if lane == 0:
                            cuda.atomic.max(progress, tile, k + 1)
            k1 = k + 1  # the next pixel's global reads (s = -1: the first pixel's)
            if 0 <= k1 < V and i < U:
                y, x, has_a, ya, xa, has_b, yb, xb = geometry(k1, u, U, V, row_major, sv, adu, adv, bdu, bdv)
                base1 = (y * w + x) * n
                for j in range(K):
                    d = c0 + j
                    if d < n:
                        cn[j] = int32(C[uint64(base1 + d)])
                gn = int32(guide[uint64(y * w + x)])
                gan = int32(guide[uint64(ya * w + xa)]) if has_a else int32(0)
                gbn = int32(guide[uint64(yb * w + xb)]) if has_b else int32(0)
                if glob:
                    if lane == 0:
                        need = min(V, k1 + skew)  # its pixels up to the next pixel's neighbours
                        while known < need:
                            known = cuda.atomic.add(progress, tile - 1, 0)
                    _syncwarp()
                    prev = (tile - 1) * V  # the previous tile's last line, at the neighbours' steps
                    if has_a and cone:
                        man = _l2(Mg, uint64(prev + k1 + adv * sv))
                        load_line(Lg, (prev + k1 + adv * sv) * n, c0, n, pa)
                    if has_b:
                        mbn = _l2(Mg, uint64(prev + k1 + bdv * sv))
                        load_line(Lg, (prev + k1 + bdv * sv) * n, c0, n, pb)
            cuda.syncthreads()

    return stable_cache_key(kernel)
