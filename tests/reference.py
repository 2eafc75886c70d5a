"""Small, slow, obviously-correct NumPy references for the stages (tiny images only)."""
import math

import numpy as np

OUTSIDE = 255


def clamp(v, lo, hi):
    return min(max(v, lo), hi)


def census(img, wx, wy):
    h, w = img.shape
    out = np.zeros((h, w), np.uint64)
    for y in range(h):
        for x in range(w):
            bits = 0
            for j in range(-(wy // 2), wy // 2 + 1):
                for i in range(-(wx // 2), wx // 2 + 1):
                    if i == 0 and j == 0:
                        continue
                    v = img[clamp(y + j, 0, h - 1), clamp(x + i, 0, w - 1)]
                    bits = (bits << 1) | int(v < img[y, x])
            out[y, x] = bits
    return out


def census_volume(L, R, min_d, ndisp, wx, wy):
    cl, cr = census(L, wx, wy), census(R, wx, wy)
    nbits = wx * wy - 1
    h, w = L.shape
    vol = np.full((h, w, ndisp), OUTSIDE, np.uint8)
    for y in range(h):
        for x in range(w):
            for d in range(ndisp):
                xr = x - min_d - d
                if 0 <= xr < w:
                    ham = bin(int(cl[y, x]) ^ int(cr[y, xr])).count("1")
                    vol[y, x, d] = (ham * 255 + nbits // 2) // nbits
    return vol


def window_mean(img, y, x, rx, ry):
    h, w = img.shape
    s = 0.0
    for j in range(-ry, ry + 1):
        for i in range(-rx, rx + 1):
            s += img[clamp(y + j, 0, h - 1), clamp(x + i, 0, w - 1)]
    return s / ((2 * rx + 1) * (2 * ry + 1))


def window_cost_volume(L, R, min_d, ndisp, rx, ry, kind):
    """kind: sad, ssd, zncc, zssd. Returns float costs in cost units (before uint8 rounding), NaN outside."""
    h, w = L.shape
    L = L.astype(np.float64)
    R = R.astype(np.float64)
    vol = np.full((h, w, ndisp), np.nan)
    for d in range(ndisp):
        Rs = np.empty_like(R)
        for x in range(w):
            Rs[:, x] = R[:, clamp(x - min_d - d, 0, w - 1)]
        for y in range(h):
            for x in range(w):
                xr = x - min_d - d
                if not 0 <= xr < w:
                    continue
                ys = [clamp(y + j, 0, h - 1) for j in range(-ry, ry + 1)]
                xs = [clamp(x + i, 0, w - 1) for i in range(-rx, rx + 1)]
                a = L[np.ix_(ys, xs)]
                b = Rs[np.ix_(ys, xs)]
                if kind == "sad":
                    vol[y, x, d] = 4 * np.abs(a - b).mean()
                elif kind == "ssd":
                    vol[y, x, d] = 4 * math.sqrt(((a - b) ** 2).mean())
                elif kind == "zssd":
                    vol[y, x, d] = 4 * math.sqrt(max(0.0, (((a - a.mean()) - (b - b.mean())) ** 2).mean()))
                elif kind == "zncc":  # (a flat window, variance at most 1e-3 + 1e-5 x mean square: ZNCC 0)
                    va, vb = a.var(), b.var()
                    flat = va <= 1e-3 + 1e-5 * (a * a).mean() or vb <= 1e-3 + 1e-5 * (b * b).mean()
                    ncc = 0.0 if flat else ((a - a.mean()) * (b - b.mean())).mean() / math.sqrt(va * vb)
                    vol[y, x, d] = (1 - ncc) * 127.5
    return np.minimum(vol, 255)


DIRS = {
    4: [(1, 0), (-1, 0), (0, 1), (0, -1)],
    8: [(1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (-1, 1), (1, -1), (-1, -1)],
}
DIRS[16] = DIRS[8] + [(2, 1), (-2, 1), (1, 2), (-1, 2), (2, -1), (-2, -1), (1, -2), (-1, -2)]


def sgm(C, guide, p1, p2, adaptive, paths):
    """Textbook SGM: for each direction visit pixels in an order where the previous pixel
    (x - dx, y - dy) comes first, L = C + min(...) - min(prev), S = sum over directions."""
    h, w, n = C.shape
    S = np.zeros((h, w, n), np.int64)
    C = C.astype(np.int64)
    for dx, dy in DIRS[paths]:
        L = np.zeros((h, w, n), np.int64)
        ys = range(h) if dy >= 0 else range(h - 1, -1, -1)
        xs = list(range(w)) if dx >= 0 else list(range(w - 1, -1, -1))
        for y in ys:
            for x in xs:
                px, py = x - dx, y - dy
                if not (0 <= px < w and 0 <= py < h):
                    L[y, x] = C[y, x]
                    continue
                prev = L[py, px]
                m = prev.min()
                pen2 = p2
                if adaptive:
                    step = abs(int(guide[y, x]) - int(guide[py, px]))
                    pen2 = max(p1, (p2 * 16) // (16 + step))
                for d in range(n):
                    best = prev[d]
                    if d > 0:
                        best = min(best, prev[d - 1] + p1)
                    if d < n - 1:
                        best = min(best, prev[d + 1] + p1)
                    best = min(best, m + pen2)
                    L[y, x, d] = C[y, x, d] + best - m
        S += L
    return S


MGM_PASSES = [((-1, 0), (0, -1)), ((1, 0), (0, 1)), ((0, 1), (-1, 0)), ((0, -1), (1, 0)),
              ((-1, -1), (1, -1)), ((1, -1), (1, 1)), ((1, 1), (-1, 1)), ((-1, 1), (-1, -1))]


def mgm(C, guide, p1, p2, adaptive, paths):
    """Textbook MGM (Facciolo et al. 2015): pass k has neighbours p + a, p + b and visits
    the pixels in increasing order of -(a + b) . p (both neighbours come first); for each
    neighbour q inside the image T_q = SGM's min(...) - min(L(q)), L = C + (T_a + T_b) // 2
    (C + T_q with one, C with none); S = sum over the first `paths` passes."""
    h, w, n = C.shape
    S = np.zeros((h, w, n), np.int64)
    C = C.astype(np.int64)
    for a, b in MGM_PASSES[:paths]:
        kx, ky = -(a[0] + b[0]), -(a[1] + b[1])
        order = sorted(((kx * x + ky * y, y, x) for y in range(h) for x in range(w)))
        L = np.zeros((h, w, n), np.int64)
        for _, y, x in order:
            terms = []
            for dx, dy in (a, b):
                qx, qy = x + dx, y + dy
                if not (0 <= qx < w and 0 <= qy < h):
                    continue
                prev = L[qy, qx]
                m = prev.min()
                pen2 = p2
                if adaptive:
                    pen2 = max(p1, (p2 * 16) // (16 + abs(int(guide[y, x]) - int(guide[qy, qx]))))
                t = np.empty(n, np.int64)
                for d in range(n):
                    best = min(prev[d], m + pen2)
                    if d > 0:
                        best = min(best, prev[d - 1] + p1)
                    if d < n - 1:
                        best = min(best, prev[d + 1] + p1)
                    t[d] = best - m
                terms.append(t)
            L[y, x] = C[y, x] + (sum(terms) // len(terms) if terms else 0)
        S += L
    return S


def wta(S, min_d, uniqueness, subpixel):
    h, w, n = S.shape
    out = np.full((h, w), np.nan, np.float32)
    for y in range(h):
        for x in range(w):
            cand = [d for d in range(n) if 0 <= x - min_d - d < w]
            if not cand:
                continue
            costs = {d: int(S[y, x, d]) for d in cand}
            best = min(cand, key=lambda d: (costs[d], d))
            bc = costs[best]
            if uniqueness > 0 and any(costs[d] * (100 - uniqueness) < bc * 100
                                      for d in cand if abs(d - best) > 1):
                continue
            v = np.float32(best + min_d)
            if subpixel and cand[0] < best < cand[-1]:
                c0, c2 = costs[best - 1], costs[best + 1]
                den = c0 + c2 - 2 * bc
                if den > 0:  # parabola vertex, in float32 like the product
                    v += np.float32(c0 - c2) / np.float32(2 * den)
            out[y, x] = v
    return out


def confidence(S, min_d):
    """Margin of the best cost over the smallest cost more than one disparity away,
    (runner-up - best) / runner-up; 1 without a runner-up, 0 without a candidate."""
    h, w, n = S.shape
    out = np.zeros((h, w), np.float32)
    for y in range(h):
        for x in range(w):
            cand = [d for d in range(n) if 0 <= x - min_d - d < w]
            if not cand:
                continue
            best = min(cand, key=lambda d: (int(S[y, x, d]), d))
            others = [int(S[y, x, d]) for d in cand if abs(d - best) > 1]
            if not others:
                out[y, x] = 1.0
            elif min(others) > 0:
                out[y, x] = np.float32(min(others) - int(S[y, x, best])) / np.float32(min(others))
    return out


def wta_right(S, min_d):
    h, w, n = S.shape
    out = np.full((h, w), np.nan, np.float32)
    for y in range(h):
        for xr in range(w):
            cand = [(int(S[y, xr + min_d + d, d]), d) for d in range(n) if 0 <= xr + min_d + d < w]
            if cand:
                out[y, xr] = min(cand)[1] + min_d
    return out


def lr_check(disp, disp_r, max_diff):
    h, w = disp.shape
    out = disp.copy()
    for y in range(h):
        for x in range(w):
            d = disp[y, x]
            if np.isnan(d):
                continue
            xr = int(math.floor(x - d + 0.5))
            if not 0 <= xr < w or not abs(d - disp_r[y, xr]) <= max_diff:
                out[y, x] = np.nan
    return out


def speckle(disp, max_size, max_diff):
    h, w = disp.shape
    seen = np.zeros((h, w), bool)
    out = disp.copy()
    for y0 in range(h):
        for x0 in range(w):
            if seen[y0, x0] or np.isnan(disp[y0, x0]):
                continue
            region, todo = [], [(y0, x0)]
            seen[y0, x0] = True
            while todo:
                y, x = todo.pop()
                region.append((y, x))
                for yy, xx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                    if 0 <= yy < h and 0 <= xx < w and not seen[yy, xx] and not np.isnan(disp[yy, xx]) \
                            and abs(disp[yy, xx] - disp[y, x]) <= max_diff:
                        seen[yy, xx] = True
                        todo.append((yy, xx))
            if len(region) <= max_size:
                for y, x in region:
                    out[y, x] = np.nan
    return out


def fill(disp, mode):
    h, w = disp.shape
    out = disp.copy()
    for y in range(h):
        valid = [x for x in range(w) if not np.isnan(disp[y, x])]
        for x in range(w):
            if not np.isnan(disp[y, x]):
                continue
            left = [v for v in valid if v < x]
            right = [v for v in valid if v > x]
            cands = []
            if left:
                cands.append((x - left[-1], disp[y, left[-1]]))
            if right:
                cands.append((right[0] - x, disp[y, right[0]]))
            if not cands:
                continue
            if right and disp[y, right[0]] > x:  # x - d < 0 for the surface on the right: the left border strip
                out[y, x] = disp[y, right[0]]
            elif left and x - disp[y, left[-1]] >= w:  # x - d >= w for the one on the left: the right border
                out[y, x] = disp[y, left[-1]]
            elif mode == "background":
                out[y, x] = min(v for _, v in cands)
            else:
                out[y, x] = min(cands, key=lambda c: c[0])[1] if len(cands) == 1 or cands[0][0] != cands[1][0] \
                    else cands[0][1]
    return out


def fill2d(disp, dirs=((0, 1), (0, -1), (1, 0), (-1, 0), (1, 1), (1, -1), (-1, 1), (-1, -1))):
    """Hirschmueller's 2-D fill: each invalid pixel looks along each direction (dy, dx)
    for the nearest valid pixel; it takes the second smallest of those disparities (the
    smallest when one direction finds one; NaN when none does)."""
    h, w = disp.shape
    out = disp.copy()
    for y in range(h):
        for x in range(w):
            if not np.isnan(disp[y, x]):
                continue
            found = []
            for dy, dx in dirs:
                k = 1
                while 0 <= y + k * dy < h and 0 <= x + k * dx < w:
                    if not np.isnan(disp[y + k * dy, x + k * dx]):
                        found.append(disp[y + k * dy, x + k * dx])
                        break
                    k += 1
            if found:
                out[y, x] = sorted(found)[min(1, len(found) - 1)]
    return out


def border_slope(disp, fit=40, band=1.0, smax=0.3, rms=0.3, rows=8, cols=10, lo=-np.inf, hi=np.inf):
    """Fill mode "slope" before the background fill: each invalid run whose right-hand
    valid pixel e has d > x takes d(e) + s * (x - e) where that is > x; s is the median
    of the line fits (np.polyfit) at such pixels e' within `rows` rows and `cols` columns,
    each through the first `fit` valid pixels from e' (within 3 * fit columns) inside the
    band |d - d(e')| < band + smax * distance, kept when at least 5 and RMS <= rms,
    clamped to +-smax; the values held within [lo, hi] (the search range)."""
    h, w = disp.shape
    ends = {}  # (y, e) -> first x of the run
    slopes = {}
    for y in range(h):
        x = 0
        while x < w:
            if not np.isnan(disp[y, x]):
                x += 1
                continue
            e = x
            while e < w and np.isnan(disp[y, e]):
                e += 1
            if e < w and disp[y, e] > x:
                ends[(y, e)] = x
                xs = [k for k in range(e, min(w, e + 3 * fit)) if not np.isnan(disp[y, k])][:fit]
                xs = [k for k in xs if abs(disp[y, k] - disp[y, e]) < band + (k - e) * smax]
                if len(xs) >= 5:
                    b, a = np.polyfit(np.array(xs, float) - e, disp[y, xs].astype(float), 1)
                    res = disp[y, xs] - (a + b * (np.array(xs, float) - e))
                    if np.sqrt(np.mean(res ** 2)) <= rms:
                        slopes[(y, e)] = float(np.clip(b, -smax, smax))
            x = e
    out = disp.copy()
    for (y, e), x0 in ends.items():
        near = [v for (yy, ee), v in slopes.items() if abs(yy - y) <= rows and e - cols <= ee < e + cols]
        s = float(np.median(near)) if near else 0.0
        for x in range(x0, e):
            v = np.float32(np.clip(np.float32(disp[y, e] + s * (x - e)), lo, hi))
            if v > x:
                out[y, x] = v
    return out


def median(disp, r):
    h, w = disp.shape
    out = disp.copy()
    for y in range(h):
        for x in range(w):
            if np.isnan(disp[y, x]):
                continue
            vals = [disp[clamp(y + j, 0, h - 1), clamp(x + i, 0, w - 1)]
                    for j in range(-r, r + 1) for i in range(-r, r + 1)]
            vals = [v for v in vals if not np.isnan(v)]
            out[y, x] = np.float32(np.median(np.array(vals, np.float32)))
    return out


def gaussian_blur(img, k):
    h, w = img.shape
    r = len(k) // 2
    tmp = np.zeros_like(img, dtype=np.float64)
    for y in range(h):
        for x in range(w):
            tmp[y, x] = sum(k[i] * img[y, clamp(x + i - r, 0, w - 1)] for i in range(len(k)))
    out = np.zeros_like(tmp)
    for y in range(h):
        for x in range(w):
            out[y, x] = sum(k[i] * tmp[clamp(y + i - r, 0, h - 1), x] for i in range(len(k)))
    return out


def bt_volume(L, R, min_d, ndisp, rx, ry):
    """Birchfield-Tomasi dissimilarity (half-pixel interpolated ranges) averaged over the
    window, in cost units (x4), NaN outside; borders replicate the edge pixel."""
    h, w = L.shape
    L = L.astype(np.float64)
    R = R.astype(np.float64)

    def rng(img, y, x):
        a = img[y, x]
        lo = 0.5 * (a + img[y, clamp(x - 1, 0, w - 1)])
        hi = 0.5 * (a + img[y, clamp(x + 1, 0, w - 1)])
        return min(a, lo, hi), max(a, lo, hi)

    def bt(y, x, xr):
        a, b = L[y, x], R[y, xr]
        amin, amax = rng(L, y, x)
        bmin, bmax = rng(R, y, xr)
        return min(max(0.0, b - amax, amin - b), max(0.0, a - bmax, bmin - a))

    vol = np.full((h, w, ndisp), np.nan)
    for y in range(h):
        for x in range(w):
            for d in range(ndisp):
                if not 0 <= x - min_d - d < w:
                    continue
                vals = [bt(clamp(y + j, 0, h - 1), clamp(x + i, 0, w - 1), clamp(clamp(x + i, 0, w - 1) - min_d - d,
                                                                                   0, w - 1))
                        for j in range(-ry, ry + 1) for i in range(-rx, rx + 1)]
                vol[y, x, d] = min(255.0, 4 * np.mean(vals))
    return vol


def weighted_median(disp, guide, r, step=2, edge=2.0, edge_r=2, sigma=8.0):
    """At valid pixels whose valid neighbours within edge_r (a square) span >= edge px:
    the valid samples every `step` px of the (2r+1)^2 window, each weighted by
    round(1024 exp(-sum over channels |guide - centre| / (3 sigma))) (a grey guide's
    difference counted three times); the value is the weighted mean of the samples in
    the lowest 1 px bin (floor) at which the weights, taken in bin order, reach half."""
    h, w = disp.shape
    g = guide.astype(np.int64)
    if g.ndim == 2:
        g = g[:, :, None]
    out = disp.copy()
    for y in range(h):
        for x in range(w):
            if np.isnan(disp[y, x]):
                continue
            near = disp[max(0, y - edge_r):y + edge_r + 1, max(0, x - edge_r):x + edge_r + 1]
            if np.nanmax(near) - np.nanmin(near) < edge:
                continue
            ys = np.arange(max(0, y - r), min(h, y + r + 1), step)
            xs = np.arange(max(0, x - r), min(w, x + r + 1), step)
            d = disp[np.ix_(ys, xs)].ravel()
            diff = np.abs(g[np.ix_(ys, xs)] - g[y, x]).sum(axis=2).ravel() * (3 // g.shape[2])
            wt = np.round(1024 * np.exp(-diff / (3 * sigma)))
            keep = ~np.isnan(d)
            if not keep.any():  # no valid sample (the centre at odd offsets from a border): its own value
                continue
            d, wt = d[keep], wt[keep]
            bins = np.floor(d)
            order = np.argsort(bins, kind="stable")
            cum = np.cumsum(wt[order])
            b = bins[order][np.searchsorted(2 * cum, wt.sum())]
            sel = bins == b
            out[y, x] = np.float32((wt[sel] * d[sel].astype(np.float64)).sum() / wt[sel].sum()) if wt[sel].sum() else disp[y, x]
    return out
