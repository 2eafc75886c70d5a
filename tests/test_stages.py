"""Each CPU stage against the slow NumPy reference in tests/reference.py.

Integer stages (census, SGM, WTA on integer volumes, LR check, speckle, fill,
median) must agree bit for bit; float window costs agree to 1 cost unit
(the uint8 rounding of a float mean)."""
import numpy as np
import pytest

import reference as ref
from stereocli.backends.cpu import CpuBackend
from stereocli.config import Params, max_p2
from stereocli.pipeline import cost_volume
from stereocli.stages import cost, preprocess, refine

BK = CpuBackend()


def random_images(rng, h=12, w=20):
    return (rng.integers(0, 256, (h, w)).astype(np.float32),
            rng.integers(0, 256, (h, w)).astype(np.float32))


def test_census_costs_computed_on_the_cpu_are_the_lookup_table():
    """The CPU's census volume scales Hamming distances with a multiply and a shift
    (census_scale_magic) where the GPU looks them up in census_scale: the same cost for
    every distance of every census size the options accept."""
    from stereocli.config import CENSUS_MAX_BITS
    h = np.arange(65, dtype=np.uint64)
    for nbits in range(1, CENSUS_MAX_BITS + 1):
        mul, add, shift = cost.census_scale_magic(nbits)
        assert 64 * int(mul) + int(add) < 2 ** 32  # no uint32 overflow
        got = np.minimum((h * np.uint64(mul) + np.uint64(add)) >> np.uint64(shift), 255)
        want = np.minimum((h * 255 + nbits // 2) // nbits, 255)  # the reference's rounding
        np.testing.assert_array_equal(got, want, err_msg=f"{nbits} bits")


@pytest.mark.parametrize("wx,wy,min_d", [(9, 7, 0), (5, 3, -2), (3, 3, 4), (7, 5, 1)])
@pytest.mark.parametrize("dtype,h,w", [(np.float32, 12, 20), (np.uint8, 12, 20), (np.uint8, 3, 4)])
def test_census_volume_matches_reference(rng, wx, wy, min_d, dtype, h, w):
    """Grey bytes (the pipeline's census input) and floats (after preprocessing); an
    image smaller than the window (its edges replicated further than it is wide)."""
    L, R = (a.astype(dtype) for a in random_images(rng, h, w))
    got = BK.census_volume(L, R, min_d, 6, wx, wy)
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, ref.census_volume(L, R, min_d, 6, wx, wy))


@pytest.mark.parametrize("wx,wy", [(9, 7), (5, 5), (3, 3)])
def test_census_volume_over_many_disparities_matches_reference(rng, wx, wy):
    """Rows wide enough for the costs' vectorised loop (a pixel's 40 disparities in
    vectors, with a remainder), not only its scalar remainder."""
    L, R = random_images(rng, 6, 70)
    got = BK.census_volume(L, R, -3, 40, wx, wy)
    np.testing.assert_array_equal(got, ref.census_volume(L, R, -3, 40, wx, wy))


@pytest.mark.parametrize("kind", ["sad", "ssd", "zssd", "zncc"])
def test_window_costs_match_reference(rng, kind):
    L, R = random_images(rng, 10, 16)
    p = Params(cost=kind, window=(5, 3), min_disparity=1, num_disparities=5)
    got = cost_volume(BK, L, R, p).astype(np.float64)
    want = ref.window_cost_volume(L, R, 1, 5, 2, 1, kind)
    assert np.all(got[np.isnan(want)] == 255)
    # where both windows lie inside the images (borders replicate edge pixels and the
    # zero-mean costs take the right window's mean around x - d)
    h, w, n = want.shape
    y, x, d = np.meshgrid(np.arange(h), np.arange(w), np.arange(n), indexing="ij")
    inner = (y >= 1) & (y < h - 1) & (x + 2 < w) & (x - 1 - d - 2 >= 0)
    assert inner.sum() > 100
    assert np.abs(got[inner] - want[inner]).max() <= 1.0


@pytest.mark.parametrize("level", [200.0, 200.3, 3.7])
def test_zncc_of_a_flat_window_is_no_preference(rng, level):
    """ZNCC is 0 / 0 where a window is flat: such a pixel's costs are all 128 (no
    disparity preferred), not the rounding of the window means blown up; textured
    windows at the true shift still cost next to nothing. Whole and fractional grey
    levels (the preprocessing hands on floats) alike."""
    L = rng.integers(0, 256, (16, 40)).astype(np.float32)
    L[:, 8:26] = level  # a flat band, 18 columns
    R = np.roll(L, -2, axis=1)
    vol = cost_volume(BK, L, R, Params(cost="zncc", window=(5, 5), min_disparity=0, num_disparities=4))
    flat = vol[2:-2, 10:24]  # the 5x5 window inside the band
    assert np.all(flat == 128)
    assert np.all(vol[2:-2, 30:-2, 2] <= 2)  # textured, at the shift


def test_sad_cost_is_zero_at_true_shift():
    from conftest import textured_pair
    L, R = textured_pair(shift=3)
    vol = cost_volume(BK, L, R, Params(cost="sad", window=(3, 3), min_disparity=0, num_disparities=8))
    assert np.all(vol[:, 4:, 3] == 0)  # window (3x3) inside the right image
    assert np.all(vol[:, 3:, 5] > 0)


@pytest.mark.parametrize("paths", [4, 8, 16])
@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("largest,n", [(False, 7), (True, 7), (False, 1)])
def test_sgm_matches_reference(rng, paths, adaptive, largest, n):
    """Also with the largest P1 and P2 the options accept (P1 = P2 = config.max_p2), and
    one disparity (both neighbours beyond the range): the CPU's sweeps run in
    uint16, and nothing may wrap."""
    h, w = 9, 11
    p1, p2 = (max_p2(paths),) * 2 if largest else (20, 200)
    Params(paths=paths, p1=p1, p2=p2).validate()  # (the options accept them)
    C = rng.integers(0, 256, (h, w, n)).astype(np.uint8)
    guide = rng.integers(0, 256, (h, w)).astype(np.uint8)
    got = BK.sgm(C, guide, p1, p2, adaptive, paths)
    assert got.dtype == np.uint16
    np.testing.assert_array_equal(got, ref.sgm(C, guide, p1, p2, adaptive, paths))


@pytest.mark.parametrize("paths", [4, 8])
@pytest.mark.parametrize("h,w,n,adaptive", [(9, 11, 7, True), (13, 5, 6, False), (4, 17, 9, True)])
def test_mgm_matches_reference(rng, paths, h, w, n, adaptive):
    """More Global Matching: each pass's two neighbours, the quadrant passes walked pixel
    by pixel and the cone passes (8 paths) by whole lines, by rows and by columns."""
    C = rng.integers(0, 256, (h, w, n)).astype(np.uint8)
    guide = rng.integers(0, 256, (h, w)).astype(np.uint8)
    got = BK.mgm(C, guide, 20, 200, adaptive, paths)
    assert got.dtype == np.uint16
    np.testing.assert_array_equal(got, ref.mgm(C, guide, 20, 200, adaptive, paths))


def test_mgm_tiles_of_the_quadrant_passes_match_reference(rng):
    """The CPU walks a quadrant pass in tiles of 16 lines x 32 pixels, the tiles of an
    anti-diagonal in parallel: an image of several tiles each way, none of them whole."""
    from stereocli.stages import aggregate
    C = rng.integers(0, 256, (37, 70, 4)).astype(np.uint8)
    guide = rng.integers(0, 256, (37, 70)).astype(np.uint8)
    S = np.empty(C.shape, np.uint16)
    p2tab = aggregate.p2_table(20, 200, True)
    for i, (a, b) in enumerate(aggregate.MGM_PASSES[:4]):  # the tiles, whatever the thread count
        _, su, sv, _, _ = aggregate.mgm_plan(a, b)
        aggregate.mgm_quadrant_cpu(C, guide, np.int32(20), p2tab, S, su, sv, i == 0, 16, 32)
    np.testing.assert_array_equal(S, ref.mgm(C, guide, 20, 200, True, 4))


def test_mgm_spreads_a_match_over_the_quadrant_not_only_along_lines():
    """A single strong match at the top-left corner: SGM's rightward and downward paths
    carry it along its row and its column only; MGM's first pass carries it to every
    pixel below and to the right of it."""
    h, w, n = 6, 6, 4
    C = np.full((h, w, n), 10, np.uint8)
    C[0, 0] = [0, 10, 10, 10]  # disparity 0 preferred at one pixel only
    guide = np.zeros((h, w), np.uint8)
    from stereocli.stages import aggregate
    S = aggregate.mgm_cpu(C, guide, 2, 8, False, 4)
    sgm = aggregate.sgm_cpu(C, guide, 2, 8, False, 4)
    assert (S[3, 3, 1:] > S[3, 3, 0]).all()  # off the corner's row and column: MGM prefers d = 0
    assert (sgm[3, 3] == sgm[3, 3, 0]).all()  # SGM has no preference there


@pytest.mark.parametrize("paths", [4, 8])
@pytest.mark.parametrize("h,w", [(9, 11), (17, 5), (4, 40)])
def test_sgm_vertical_sweeps_by_rows_and_by_lines_match_reference(rng, paths, h, w):
    """Many threads sweep the vertical paths in blocks of lines, few in raster passes:
    either way the sums of the reference (tall, wide and square images: lines that
    start on the top row and on the side columns)."""
    from stereocli.stages import aggregate
    C = rng.integers(0, 256, (h, w, 6)).astype(np.uint8)
    guide = rng.integers(0, 256, (h, w)).astype(np.uint8)
    want = ref.sgm(C, guide, 20, 200, True, paths)
    for by_lines in (False, True):
        np.testing.assert_array_equal(aggregate.sgm_cpu(C, guide, 20, 200, True, paths, by_lines), want)


@pytest.mark.parametrize("ndisp", [16, 64, "past the stack"])
@pytest.mark.parametrize("h,tasks", [(1, 1), (2, 1), (3, 1), (5, 2), (7, 3)])
def test_horizontal_walks_give_the_same_sums_two_rows_at_a_time_with_their_path_costs_on_the_stack_or_the_heap(
        rng, ndisp, h, tasks):
    """The horizontal sweep walks two rows at a time (a run's odd last row alone), their
    path costs on the stack up to stack.STACK_ELEMENTS (four rows of n + 2) and on the
    heap past it: the reference's sums either way (its loops over d through views below
    64 disparities, in place from 64), for runs of rows of any length."""
    from stereocli.stages import aggregate, stack
    n = stack.STACK_ELEMENTS // 4 if ndisp == "past the stack" else ndisp
    assert (4 * (n + 2) <= stack.STACK_ELEMENTS) == (ndisp != "past the stack")
    w = 3 if ndisp == "past the stack" else 40
    C = rng.integers(0, 256, (h, w, n)).astype(np.uint8)
    guide = rng.integers(0, 256, (h, w)).astype(np.uint8)
    S = np.empty(C.shape, np.uint16)
    aggregate.sgm_horizontal_cpu(C, guide, np.int32(20), aggregate.p2_table(20, 200, True), S, tasks)
    want = np.stack([ref.sgm(C[y:y + 1], guide[y:y + 1], 20, 200, True, 4)[0] for y in range(h)])
    # (each row alone: each of the reference's vertical paths adds the costs alone)
    np.testing.assert_array_equal(S, want - 2 * C.astype(np.int64))


@pytest.mark.parametrize("h,w,bands,steps", [(9, 11, 2, 3), (9, 11, 3, 2), (17, 13, 1, 32), (20, 40, 5, 5),
                                             (7, 24, 4, 4), (6, 9, 2, 2)])
def test_sgm_vertical_sweeps_in_tiles_match_reference(rng, h, w, bands, steps):
    """With many threads the 8-path vertical sweeps go in tiles (column bands, several
    rows a fork): for any bands and rows per fork the reference's sums, the rows where
    the sweeps down and up meet included (steps of more than half the height)."""
    from stereocli.stages import aggregate
    C = rng.integers(0, 256, (h, w, 6)).astype(np.uint8)
    guide = rng.integers(0, 256, (h, w)).astype(np.uint8)
    p2tab = aggregate.p2_table(20, 200, True)
    S = np.empty((h, w, 6), np.uint16)
    aggregate.sgm_horizontal_cpu(C, guide, np.int32(20), p2tab, S, 2)
    aggregate.sgm_vertical3_cpu(C, guide, np.int32(20), p2tab, S, bands, steps)
    np.testing.assert_array_equal(S, ref.sgm(C, guide, 20, 200, True, 8))


@pytest.mark.parametrize("paths", [4, 8])
@pytest.mark.parametrize("h,w,ndisp,min_d", [(9, 11, 6, 0), (16, 13, 8, -3), (4, 40, 6, 2), (7, 5, 12, 1),
                                             (5, 70, 64, -2), (6, 80, 72, 3)])
def test_sgm_from_a_stored_volume_or_census_costs_computed_as_it_sweeps_matches_reference(rng, paths, h, w, ndisp,
                                                                                          min_d):
    """Large volumes on the CPU are not stored: the SGM computes each pixel's census costs
    from the census strings as its sweeps reach it. Either way, the sums of the reference
    SGM over the reference census volume, with disparities outside the right image (a
    range wider than the image, negative and positive offsets), odd and even heights (the
    middle row that both vertical sweeps add to), and fewer and more than 64 disparities
    (the horizontal sweep's two forms of its loops over d)."""
    from stereocli.stages import aggregate
    L, R = random_images(rng, h, w)
    guide = L.astype(np.uint8)
    C = ref.census_volume(L, R, min_d, ndisp, 9, 7)
    want = ref.sgm(C, guide, 20, 200, True, paths)
    np.testing.assert_array_equal(aggregate.sgm_cpu(C, guide, 20, 200, True, paths, by_lines=False), want)
    codes = cost.census_codes(cost.census_transform_cpu(L, 9, 7), cost.census_transform_cpu(R, 9, 7),
                              min_d, ndisp, 62)
    np.testing.assert_array_equal(aggregate.sgm_cpu(None, guide, 20, 200, True, paths, codes=codes), want)


@pytest.mark.parametrize("min_d", [0, -3, 2])
@pytest.mark.parametrize("uniq,subpix", [(0.0, False), (10.0, True), (40.0, True)])
def test_wta_matches_reference(rng, min_d, uniq, subpix):
    S = rng.integers(0, 3000, (6, 12, 8)).astype(np.uint16)
    left, right, conf = BK.select(S, min_d, uniq, subpix, True, True)
    np.testing.assert_array_equal(left, ref.wta(S, min_d, uniq, subpix))
    np.testing.assert_array_equal(right, ref.wta_right(S, min_d))
    np.testing.assert_array_equal(conf, ref.confidence(S, min_d))
    assert BK.select(S, min_d, uniq, subpix, False)[1:] == (None, None)


def test_confidence_without_runner_up_or_candidates():
    """Three disparities: no cost lies more than one away from the best, so the winner is
    certain (1); a pixel with no candidate inside the image has confidence 0."""
    S = np.array([[[5, 9, 7]] * 4], np.uint16)
    _, _, conf = BK.select(S, 2, 0.0, False, False, True)
    assert conf[0, 0] == 0 and conf[0, 1] == 0  # x - 2 - d < 0 for every d
    assert (conf[0, 2:] == 1).all()


def test_subpixel_recovers_parabola_vertex():
    d = np.arange(8)
    S = (10 * (d - 3.3) ** 2 + 50).round().astype(np.uint16).reshape(1, 1, 8)
    S = np.repeat(S, 10, axis=1)  # 10 columns so x - d stays inside the image
    disp, _, _ = BK.select(S, 0, 0.0, True, False)
    assert abs(disp[0, 9] - 3.3) < 0.05


def noisy_map(rng, h=14, w=18):
    disp = rng.uniform(0, 8, (h, w)).astype(np.float32)
    disp[rng.random((h, w)) < 0.3] = np.nan
    return disp


def test_lr_check_matches_reference(rng):
    disp = noisy_map(rng)
    disp_r = np.round(noisy_map(rng))
    np.testing.assert_array_equal(BK.lr_check(disp, disp_r, 1.0), ref.lr_check(disp, disp_r, 1.0))


def test_speckle_matches_reference(rng):
    disp = np.round(noisy_map(rng) / 3)
    np.testing.assert_array_equal(BK.speckle(disp, 5, 1.0), ref.speckle(disp, 5, 1.0))


@pytest.mark.parametrize("max_size", [5, 60, 400])
def test_speckle_joins_regions_across_the_parallel_bands(rng, max_size):
    """The CPU labels bands of rows in parallel and joins regions across their edges: a
    comb (a region that runs down and up through every band), stripes of several bands,
    NaN holes and noise give the reference's regions."""
    h, w = 150, 40
    disp = np.full((h, w), 20.0, np.float32)
    disp[:, 1::4] = 5.0  # teeth: one region each, joined by the bottom row below
    disp[-1, :] = 5.0
    disp[rng.random((h, w)) < 0.03] = np.nan
    noise = rng.random((h, w)) < 0.05
    disp[noise] = rng.integers(30, 60, noise.sum())
    want = ref.speckle(disp, max_size, 1.0)
    np.testing.assert_array_equal(BK.speckle(disp, max_size, 1.0), want)
    for bands in (1, 3, 64):  # (the backend takes one band per thread)
        sizes = refine.speckle_sizes_cpu(disp, np.float32(1.0), bands)
        np.testing.assert_array_equal(refine.speckle_apply_cpu(disp, sizes, max_size), want)


@pytest.mark.parametrize("mode,code", [("background", 1), ("nearest", 2)])
@pytest.mark.parametrize("offset", [0, -8])
def test_fill_matches_reference(rng, mode, code, offset):
    """Disparities 0..8 reach the left border rule, -8..0 the right border rule."""
    disp = noisy_map(rng) + np.float32(offset)
    got = BK.fill(disp, code)
    np.testing.assert_array_equal(got, ref.fill(disp, mode))
    assert not np.isnan(got).any()


def test_fill_gives_the_left_border_strip_the_surface_on_its_right():
    """Pixels near the left border whose surface the right camera does not see (x - d < 0
    for the disparity on their right) take that disparity, not the smaller one on their
    left; inside the image the background (smaller) disparity fills as before."""
    nan = np.nan
    row = [2.0, nan, nan, nan, nan, nan, 20.0, 20.0, 20.0, 20.0, 9.0, nan, nan, 5.0, 5.0, 5.0]
    disp = np.array([row, row], np.float32)
    got = BK.fill(disp, 1)
    np.testing.assert_array_equal(got[0, 1:6], [20.0] * 5)  # x in 1..5 < 20
    np.testing.assert_array_equal(got[0, 11:13], [5.0, 5.0])  # 5 <= x: the background of 9 and 5
    np.testing.assert_array_equal(got, ref.fill(disp, "background"))


def slanted_border_map(rng, h=24, w=90, slope=0.15, noise=0.0):
    """A plane d = 30 + slope * x with the strip x < d (and some random pixels) invalid."""
    x = np.arange(w, dtype=np.float32)
    disp = np.tile(np.float32(30) + np.float32(slope) * x, (h, 1)) + rng.normal(0, noise, (h, w)).astype(np.float32)
    disp[:, :40] = np.nan
    disp[rng.random((h, w)) < 0.1] = np.nan
    return disp


@pytest.mark.parametrize("slope,noise", [(0.15, 0.0), (-0.2, 0.05), (0.6, 0.0)])
def test_border_slope_matches_reference(rng, slope, noise):
    """Within float32 rounding of the line fits (polyfit here, running sums there)."""
    disp = slanted_border_map(rng, slope=slope, noise=noise)
    got, want = refine.border_slope_cpu(disp), ref.border_slope(disp)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, atol=1e-4, equal_nan=True)


@pytest.mark.parametrize("slope,base,lo,hi", [(0.15, 0.0, 31.0, 60.0), (-0.2, 30.0, 0.0, 55.0)])
def test_fill_slope_stays_in_the_search_range(rng, slope, base, lo, hi):
    """The strip continued along its slope never leaves the search range [lo, hi]: a
    plane rising to the right (its continuation falls below lo) and one falling (it
    rises above hi): the reference's values, held in the range where the unbounded
    continuation leaves it."""
    disp = slanted_border_map(rng, slope=slope) + np.float32(base)
    got = refine.border_slope_cpu(disp, lo, hi)
    want = ref.border_slope(disp, lo=lo, hi=hi)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, atol=1e-4, equal_nan=True)
    free = refine.border_slope_cpu(disp)
    assert np.nanmin(free[:, :40]) < lo or np.nanmax(free[:, :40]) > hi  # (the case needs the bound)
    strip = BK.fill(disp, refine.SLOPE, lo, hi)[:, :40]
    assert strip.min() >= lo and strip.max() <= hi


def test_fill_slope_continues_a_slanted_border_surface():
    """--fill slope: the strip the right camera does not see follows its surface's slope
    (the plain background fill holds it at the border pixel's disparity); a slope steeper
    than SLOPE_MAX is clamped, and the rest of the map is filled as by background."""
    rng = np.random.default_rng(3)
    disp = slanted_border_map(rng, slope=0.15)
    truth = np.float32(30) + np.float32(0.15) * np.arange(disp.shape[1], dtype=np.float32)
    got = BK.fill(disp, refine.SLOPE)
    assert not np.isnan(got).any()
    assert np.abs(got[:, :35] - truth[:35]).max() < 0.01  # where the plane has x - d < 0
    flat = BK.fill(disp, refine.BACKGROUND)
    assert np.abs(flat[:, :35] - truth[:35]).max() > 5  # 40 px at 0.15 px per px
    np.testing.assert_array_equal(got[:, 45:], flat[:, 45:])  # (the strip's last pixels, x >= d, differ)


@pytest.mark.parametrize("holes", [0.2, 0.6, 0.97])
def test_fill2d_matches_reference(rng, holes):
    """--fill 2d after the border strip: the second lowest of 8 directions' nearest valid
    disparities (sparse holes, large ones, pixels that see one direction or none)."""
    disp = rng.uniform(0, 30, (15, 21)).astype(np.float32)
    disp[rng.random(disp.shape) < holes] = np.nan
    np.testing.assert_array_equal(refine.fill2d_cpu(disp, refine.FILL2D_DIRECTIONS), ref.fill2d(disp))
    got = BK.fill(disp, refine.DIRECTIONS)
    np.testing.assert_array_equal(got, ref.fill2d(refine.border_slope_cpu(disp)))


def test_fill2d_fills_an_occlusion_with_the_background_around_it():
    """The occlusion right of a foreground block (20 on a background of 5): the 2-D fill
    gives it the background seen above, below and right of it; a lone wrong low value
    at the hole's edge, which the row fill copies along its row, does not decide it
    (the second lowest)."""
    disp = np.full((12, 24), 5.0, np.float32)
    disp[3:9, 4:13] = 20.0
    disp[3:9, 13:18] = np.nan  # what the right camera does not see
    disp[5, 18] = 0.5
    hole = np.isnan(disp)
    got = BK.fill(disp, refine.DIRECTIONS)
    assert (got[hole] == 5.0).all()
    assert (BK.fill(disp, refine.SLOPE)[5][hole[5]] == 0.5).all()


def edge_map(rng, h=20, w=26):
    """Two surfaces (d about 4 and 12) with a ragged boundary, noise, holes, and a colour
    guide whose edge runs a few pixels off the disparity edge."""
    x = np.arange(w)[None, :]
    edge = 11 + rng.integers(-2, 3, (h, 1))
    disp = np.where(x < edge, 12.0, 4.0) + rng.normal(0, 0.3, (h, w))
    disp = disp.astype(np.float32)
    disp[rng.random((h, w)) < 0.1] = np.nan
    guide = np.where((x < 9)[:, :, None], [200, 40, 90], [30, 160, 60]).repeat(h, 0)
    guide = np.clip(guide + rng.integers(-6, 7, guide.shape), 0, 255).astype(np.uint8)
    return disp, guide


@pytest.mark.parametrize("r,grey,shift", [(3, False, 0.0), (4, True, -9.5), (8, False, 0.0), (8, False, -20.25)])
def test_weighted_median_matches_reference(rng, r, grey, shift):
    disp, guide = edge_map(rng)
    disp += np.float32(shift)  # negative disparities: bins are floors, below zero too
    if grey:
        guide = guide[:, :, 1:2]
    got = BK.weighted_median(disp, guide.reshape(guide.shape[0], -1), r)  # rows of B, G, R bytes
    np.testing.assert_array_equal(got, ref.weighted_median(disp, guide[:, :, 0] if grey else guide, r))
    assert not np.array_equal(got, disp)  # some edge pixels moved


@pytest.mark.parametrize("r", [2, 4])
def test_weighted_median_keeps_a_pixel_none_of_whose_samples_is_valid(rng, r):
    """A sparse map (a small image of a far range, mostly invalid): at a pixel an odd
    number of columns and rows from the top-left corner the samples (every second pixel
    from the window's first) leave the pixel itself out, and here all of them are
    invalid; it keeps its value (the CPU once read its histogram out of bounds there and
    crashed), and the rest is the reference's."""
    disp = np.full((9, 12), np.nan, np.float32)
    disp[1, 1], disp[1, 3], disp[3, 1] = 5.0, 9.0, 13.5  # edges (spans of 2 px and more), on no sample
    disp[6:, 6:] = rng.uniform(4, 20, (3, 6)).astype(np.float32)
    guide = rng.integers(0, 256, (9, 12)).astype(np.uint8)
    got = BK.weighted_median(disp, guide, r)
    np.testing.assert_array_equal(got[1, [1, 3]], [5.0, 9.0])
    np.testing.assert_array_equal(got, ref.weighted_median(disp, guide, r))


def test_weighted_median_moves_depth_edges_to_image_edges():
    """A foreground fattened 2 px past its colour edge (as a census window leaves it)
    goes back to the colour edge; pixels away from disparity edges keep their values."""
    h, w = 16, 40
    x = np.arange(w)[None, :].repeat(h, 0)
    guide = np.where((x < 20)[:, :, None], [220, 200, 40], [40, 60, 200]).astype(np.uint8)
    disp = np.where(x < 22, 30.0, 10.0).astype(np.float32) + np.float32(0.25) * (x % 2)
    got = BK.weighted_median(disp, guide.reshape(h, -1), 8)
    assert np.all(np.abs(got[:, 20:22] - 10.0) <= 0.25)  # was 30
    assert np.all(np.abs(got[:, 19:20] - 30.0) <= 0.25)  # the foreground keeps its own
    np.testing.assert_array_equal(got[:, :19], disp[:, :19])  # no disparity edge within 2 px: untouched
    np.testing.assert_array_equal(got[:, 25:], disp[:, 25:])


@pytest.mark.parametrize("r", [1, 2])
def test_median_matches_reference(rng, r):
    disp = noisy_map(rng)
    np.testing.assert_array_equal(BK.median(disp, r), ref.median(disp, r))


def test_dog_matches_reference(rng):
    img = rng.integers(0, 256, (10, 13)).astype(np.float32)
    k1, k2 = preprocess.gaussian_kernel(0.7), preprocess.gaussian_kernel(2.0)
    want = 128 + ref.gaussian_blur(img, k1) - ref.gaussian_blur(img, k2)
    np.testing.assert_allclose(BK.dog(img, k1, k2), want, atol=1e-3)


def test_bilateral_keeps_edges_and_smooths_flat_areas(rng):
    img = np.zeros((12, 16), np.float32)
    img[:, 8:] = 200
    noisy = img + rng.normal(0, 3, img.shape).astype(np.float32)
    ss, sc = preprocess.bilateral_constants(2.0, 12.0)
    out = BK.bilateral(noisy, 3, ss, sc)
    assert np.abs(out[:, :7] - 0).mean() < np.abs(noisy[:, :7] - 0).mean()
    assert out[:, 9:].min() > 180 and out[:, :7].max() < 20  # the step survives


def test_box_u8_is_rounded_window_mean(rng):
    C = rng.integers(0, 256, (7, 9, 3)).astype(np.uint8)
    got = BK.box_u8(C, 1)
    h, w, _ = C.shape
    for y in range(h):
        for x in range(w):
            win = [C[ref.clamp(y + j, 0, h - 1), ref.clamp(x + i, 0, w - 1)].astype(int)
                   for j in (-1, 0, 1) for i in (-1, 0, 1)]
            np.testing.assert_array_equal(got[y, x], (np.sum(win, axis=0) + 4) // 9)


def test_bt_cost_matches_reference(rng):
    L, R = random_images(rng, 8, 14)
    got = cost_volume(BK, L, R, Params(cost="bt", window=(3, 3), min_disparity=1, num_disparities=4)).astype(np.float64)
    want = ref.bt_volume(L, R, 1, 4, 1, 1)
    inside = ~np.isnan(want)
    assert np.all(got[~inside] == 255)
    assert np.abs(got[inside] - want[inside]).max() <= 1.0
