"""The whole pipeline (Python API) on synthetic pairs with a known shift and on the sample pair."""
import cv2
import numpy as np
import pytest

import stereocli
from conftest import SAMPLE, SHARED_DATA, textured_pair
from stereocli import io, metrics
from stereocli.config import COSTS


@pytest.mark.parametrize("cost", COSTS)
def test_every_cost_finds_an_integer_shift(cost):
    left, right = textured_pair(h=40, w=64, shift=5, seed=3)
    disp, timings = stereocli.match(left, right, num_disparities=12, cost=cost, median=0, weighted_median=0)
    inner = disp[4:-4, 16:-4]
    assert np.nanmean(np.abs(inner - 5) < 0.5) > 0.95
    # every stage that ran is timed, in pipeline order (the median filters are off here)
    from stereocli.pipeline import STAGES
    ran = [s for s in STAGES if s not in ("median", "weighted_median")]
    assert list(timings) in (ran, [s for s in ran if s != "preprocess"])


def test_quality_preset_runs_the_weighted_median_on_colour_and_grey():
    """The quality preset's weighted median: timed as its own stage, a map as dense as
    without it that still finds the shift, for a colour (BGR) and a grey pair."""
    left, right = textured_pair(h=40, w=64, shift=5, seed=3)
    for l, r in ((left, right), (np.dstack([left, left[::-1], left]), np.dstack([right, right[::-1], right]))):
        disp, timings = stereocli.match(l.astype(np.float32), r.astype(np.float32), num_disparities=12,
                                        preset="quality")
        assert "weighted_median" in timings and "median" not in timings
        assert np.nanmean(np.abs(disp[4:-4, 16:-4] - 5) < 0.5) > 0.95


@pytest.mark.parametrize("shift", [3.25, 4.5, 6.75])
def test_subpixel_follows_a_fractional_shift(shift):
    rng = np.random.default_rng(7)
    big = cv2.GaussianBlur(rng.integers(0, 256, (48, 120)).astype(np.float32), (5, 5), 1.2)
    m = np.float32([[1, 0, shift], [0, 1, 0]])  # right(x) = left(x + shift)
    right = cv2.warpAffine(big, m, (120, 48), flags=cv2.INTER_CUBIC | cv2.WARP_INVERSE_MAP, borderMode=cv2.BORDER_REFLECT)
    disp, _ = stereocli.match(big, right, num_disparities=16, median=0, fill="none")
    inner = disp[6:-6, 24:-8]
    assert np.nanmedian(np.abs(inner - shift)) < 0.2
    assert np.nanmean(np.abs(inner - shift) < 0.5) > 0.9


def test_negative_min_disparity():
    left, right = textured_pair(h=30, w=60, shift=2, seed=5)
    # search -6..9: the answer 2 is inside
    disp, _ = stereocli.match(right[:, ::-1].copy(), left[:, ::-1].copy(), num_disparities=16, min_disparity=-6)
    inner = disp[4:-4, 4:-12]
    # swapping and mirroring the pair keeps the disparity at +2
    assert np.nanmean(np.abs(inner - 2) < 0.5) > 0.9


def test_block_matching_and_paths_options_run():
    left, right = textured_pair(h=32, w=48, shift=4, seed=9)
    for opts in ({"aggregation": "none", "block": 5}, {"paths": 4}, {"paths": 16},
                 {"preprocess": "dog"}, {"preprocess": "bilateral"}, {"lr_check": False, "fill": "nearest"}):
        disp, _ = stereocli.match(left, right, num_disparities=8, **opts)
        assert np.nanmean(np.abs(disp[4:-4, 12:-4] - 4) < 0.5) > 0.9, opts


def test_sample_pair_is_accurate():
    left, right = io.read_image(SAMPLE / "left.png"), io.read_image(SAMPLE / "right.png")
    gt = io.read_disparity(SAMPLE / "disp.pfm")
    disp, _ = stereocli.match(left, right, num_disparities=16)
    m = metrics.evaluate(disp, gt)
    assert m["bad2"] < 0.06  # OpenCV StereoSGBM: 6.0 % (shared/data/README.md)
    assert m["density"] > 0.99


def test_strips_stay_close_to_the_unsplit_result():
    left, right = io.read_image(SAMPLE / "left.png"), io.read_image(SAMPLE / "right.png")
    whole, _ = stereocli.match(left, right, num_disparities=16)
    from stereocli import config, pipeline
    from stereocli.backends.cpu import CpuBackend
    params = config.load("default", None, {"num_disparities": 16, "max_memory": 3})
    res = pipeline.run(left, right, params, CpuBackend())
    assert res.strips > 1
    same = np.isclose(res.disparity, whole, atol=0.5) | (np.isnan(res.disparity) & np.isnan(whole))
    assert same.mean() > 0.98


class _CpuWithMemory:
    """The CPU backend reporting a chosen amount of free memory."""

    def __init__(self, free):
        from stereocli.backends.cpu import CpuBackend
        self._cpu, self._free = CpuBackend(), free

    def free_memory(self):
        return self._free

    def __getattr__(self, name):
        return getattr(self._cpu, name)


def test_strip_layout_depends_on_the_image_not_on_free_memory():
    from stereocli import config, pipeline
    params = config.load("default", None, {"num_disparities": 320})
    h, w = 4000, 6000  # 7.7 G volume cells: more than one standard strip
    layouts = [pipeline.layout(h, w, params, _CpuWithMemory(free)) for free in (None, 2 ** 40, 2 ** 38)]
    assert layouts[0] == layouts[1] == layouts[2]
    strips, note = layouts[0]
    assert note is None and len(strips) > 1
    assert strips[0][2] == 0 and strips[-1][3] == h
    assert all(a[3] == b[2] for a, b in zip(strips, strips[1:]))  # kept rows tile the image
    small, note = pipeline.layout(h, w, params, _CpuWithMemory(2 ** 33))  # 8 GiB free: too little
    assert len(small) > len(strips) and "--max-memory" in note


def test_a_memory_forced_layout_stays_put_while_free_memory_moves_a_little():
    """Where a standard strip does not fit, the smaller layout follows the free memory
    in steps of two only: runs on a machine whose free memory moves between 5 and 8 GiB
    give one map, not one per run."""
    from stereocli import config, pipeline
    params = config.load("default", None, {"num_disparities": 320})
    h, w = 4000, 6000
    standard, _ = pipeline.layout(h, w, params, _CpuWithMemory(None))
    layouts = [pipeline.layout(h, w, params, _CpuWithMemory(g * 2 ** 30)) for g in (5, 5.5, 6, 7, 8)]
    strips, note = layouts[0]
    assert all(lay[0] == strips for lay in layouts)
    assert len(strips) > len(standard) and "--max-memory" in note
    assert strips[0][2] == 0 and strips[-1][3] == h and all(a[3] == b[2] for a, b in zip(strips, strips[1:]))
    room = int(5 * 2 ** 30 * pipeline.MEMORY_SHARE)  # and each strip fits the least of them
    sgm = _CpuWithMemory(None).sgm_bytes_per_element(params.paths)
    assert pipeline.strip_bytes(max(y1 - y0 for y0, y1, _, _ in strips), w, params, sgm) <= room


def test_a_strip_run_of_a_shared_scene_scores_within_a_tenth_of_a_point_of_the_unsplit_run():
    scene = SHARED_DATA / "teddy"
    if not scene.exists():
        pytest.skip("shared data not present")
    from stereocli import config, pipeline
    from stereocli.backends.cpu import CpuBackend
    left, right = io.read_image(scene / "left.png"), io.read_image(scene / "right.png")
    gt = io.read_disparity(scene / "disp.pfm")
    whole, _ = stereocli.match(left, right, num_disparities=64)
    res = pipeline.run(left, right, config.load("default", None, {"num_disparities": 64, "max_memory": 20}),
                       CpuBackend())
    assert res.strips >= 3
    assert abs(metrics.evaluate(res.disparity, gt)["bad2"] - metrics.evaluate(whole, gt)["bad2"]) <= 0.001


def test_memory_budget_too_small_is_a_user_error():
    left, right = textured_pair(h=40, w=2000)
    with pytest.raises(stereocli.StereoError, match="max-memory"):
        stereocli.match(left, right, num_disparities=256, max_memory=1)


def test_colour_and_16bit_inputs_give_the_same_result_as_grey():
    left = cv2.imread(str(SAMPLE / "left.png"))
    right = cv2.imread(str(SAMPLE / "right.png"))
    gl, gr = cv2.cvtColor(left, cv2.COLOR_BGR2GRAY), cv2.cvtColor(right, cv2.COLOR_BGR2GRAY)
    # matching runs on grey: without the weighted median (which weighs by colour) the same map
    d8, _ = stereocli.match(left, right, num_disparities=16, weighted_median=0)
    dg, _ = stereocli.match(gl, gr, num_disparities=16, weighted_median=0)
    np.testing.assert_array_equal(d8, dg)
    # with it (the default), colour moves a few depth-edge pixels only
    c, _ = stereocli.match(left, right, num_disparities=16)
    g, _ = stereocli.match(gl, gr, num_disparities=16)
    assert 0 < np.mean(np.abs(c - g) > 0.5) < 0.03
    d16, _ = stereocli.match(gl.astype(np.uint16) * 257, gr.astype(np.uint16) * 257, num_disparities=16)
    np.testing.assert_allclose(d16, g, atol=1e-3)


def test_mutual_information_survives_a_different_camera_response():
    """Right camera with another gain and gamma: MI (and census) still find the shift,
    while plain SAD, which compares grey levels directly, breaks down."""
    left, right = textured_pair(h=48, w=80, shift=6, seed=21)
    right = (255.0 * (right / 255.0) ** 2.2 * 0.8).astype(np.float32)
    inner = (slice(6, -6), slice(20, -6))

    def share_right(**opts):
        disp, _ = stereocli.match(left, right, num_disparities=16, median=0, **opts)
        return np.mean(np.abs(disp[inner] - 6) < 0.5)

    assert share_right(cost="mi") > 0.9
    assert share_right(cost="census") > 0.9
    assert share_right(cost="sad", window=(5, 5)) < 0.5


def test_a_process_memory_limit_plans_smaller_strips_and_says_so():
    """A Dask worker started with --memory-limit gives its CPU backend that limit: a pair
    whose standard strip would not fit in it runs in smaller strips, with a note."""
    from stereocli import config, pipeline
    from stereocli.backends import cpu
    params = config.load("default", None, {"num_disparities": 128})
    bk = cpu.CpuBackend()
    assert pipeline.layout(1500, 2000, params, bk) == ([(0, 1500, 0, 1500)], None)
    bk.memory_limit = (cpu._resident_bytes() or 0) + 256 * 2 ** 20
    strips, note = pipeline.layout(1500, 2000, params, bk)
    assert len(strips) > 1 and "free memory" in note and "--max-memory" in note


def test_cpu_kept_volumes_are_let_go_before_a_volume_of_another_size_is_made():
    """A large pair runs in strips of different heights: what the CPU backend keeps of
    one strip must be freed before the next strip's volumes are made, or the memory
    peaks at twice what one strip needs (the strips are planned for one)."""
    import weakref

    from stereocli.backends import cpu
    bk = cpu.CpuBackend()
    bk.KEEP_MIN_BYTES = 0
    left, right = textured_pair(h=30, w=48, shift=3, seed=7)
    a = bk.census_volume(left, right, 0, 8, 9, 7)
    kept = weakref.ref(a)
    bk.recycle(a)
    del a
    assert kept() is not None  # held for the next volume of its size
    bk.census_volume(left[:20], right[:20], 0, 8, 9, 7)
    assert kept() is None


def test_cpu_volumes_given_back_are_used_again_with_the_same_results():
    """The pipeline gives its volumes back after the selection; the CPU backend makes the
    next volumes of that size in them (every element written again, so the results are
    those of fresh arrays), and never in one that was not given back."""
    from stereocli.backends import cpu
    bk, fresh = cpu.CpuBackend(), cpu.CpuBackend()
    bk.KEEP_MIN_BYTES = 0  # keep even these small ones
    (l1, r1), (l2, r2) = (textured_pair(h=30, w=48, shift=s, seed=40 + s) for s in (3, 6))
    g1 = l1.astype(np.uint8)
    a = bk.census_volume(l1, r1, 0, 8, 9, 7)
    held = a.copy()
    b = bk.census_volume(l2, r2, 0, 8, 9, 7)  # `a` was not given back
    assert b is not a
    np.testing.assert_array_equal(a, held)
    s1 = bk.sgm(a, g1, 20, 200, True, 8)
    bk.recycle(s1, b)
    c = bk.census_volume(l1, r1, 0, 8, 9, 7)
    s2 = bk.sgm(c, g1, 20, 200, True, 8)
    assert c is b and s2 is s1  # in the given-back arrays
    np.testing.assert_array_equal(c, fresh.census_volume(l1, r1, 0, 8, 9, 7))
    np.testing.assert_array_equal(s2, fresh.sgm(c, g1, 20, 200, True, 8))
    d = bk.census_volume(l2, r2, 0, 8, 9, 7)  # nothing given back since
    assert d is not c
    from stereocli import config, pipeline
    params = config.load("default", None, {"num_disparities": 8})
    first = pipeline.run(l1, r1, params, bk).disparity
    assert len(bk._spare) == 2  # the run gave back its cost and aggregation volumes
    again = pipeline.run(l1, r1, params, bk).disparity  # made in them
    np.testing.assert_array_equal(again, first)


def test_repeated_python_matches_on_the_cpu_reuse_the_volumes_of_the_one_before(monkeypatch):
    """stereocli.match in a loop (a script over a folder, frames of a video) gets one CPU
    backend per process, which makes each match's volumes in those the match before gave
    back, instead of new ones whose pages the kernel must fault in again (cones@741x500/64
    on the 2-core machine: 74 ms a call, 51 with the volumes reused)."""
    import weakref

    import stereocli
    from stereocli.backends import get_backend
    bk = get_backend("cpu")
    assert get_backend("cpu") is bk
    monkeypatch.setattr(bk, "KEEP_MIN_BYTES", 0)  # keep even these small ones
    monkeypatch.setattr(bk, "_spare", {})  # (the process's backend: its own store back afterwards, pass or fail)
    left, right = textured_pair(h=30, w=48, shift=3, seed=11)
    first, _ = stereocli.match(left, right, num_disparities=8)
    kept = [weakref.ref(a) for a in bk._spare.values()]
    assert len(kept) == 2  # the cost and the aggregation volume
    again, _ = stereocli.match(left, right, num_disparities=8)
    assert all(r() is not None for r in kept)
    assert {id(a) for a in bk._spare.values()} == {id(r()) for r in kept}  # made in them, given back again
    np.testing.assert_array_equal(again, first)


def test_cpu_keeps_the_aggregate_when_the_cost_volume_is_too_small_to_keep():
    """At sizes where the uint8 cost volume is under KEEP_MIN_BYTES and the uint16
    aggregate over it (741x500/64: 24 and 47 MB), the next match of that size makes its
    aggregate in the kept one: making the cost volume must not drop it (every match
    then mapped and faulted in a new one)."""
    import weakref

    from stereocli import config, pipeline
    from stereocli.backends import cpu
    bk = cpu.CpuBackend()
    left, right = textured_pair(h=30, w=48, shift=3, seed=5)
    bk.KEEP_MIN_BYTES = 30 * 48 * 8 + 1  # the costs (1 byte a cell) below, the aggregate (2) above
    params = config.load("default", None, {"num_disparities": 8})
    first = pipeline.run(left, right, params, bk).disparity
    (kept,) = bk._spare.values()
    ref = weakref.ref(kept)
    del kept
    again = pipeline.run(left, right, params, bk).disparity
    assert ref() is not None and list(bk._spare.values()) == [ref()]  # made in it, given back again
    np.testing.assert_array_equal(again, first)


def test_cpu_census_costs_computed_as_the_sgm_sweeps_give_the_same_map(monkeypatch):
    """From CENSUS_ON_THE_FLY_CELLS volume cells on, the CPU stores no census volume (its
    SGM computes the costs from the census strings): the map is the stored volume's, for
    4 and 8 paths, and for the other paths and aggregations, which keep the volume."""
    from stereocli import config, pipeline
    from stereocli.backends import cpu
    left, right = textured_pair(h=37, w=64, shift=5, seed=11)
    for opts in ({}, {"paths": 4, "min_disparity": -3}, {"paths": 16}, {"aggregation": "mgm"}):
        params = config.load("default", None, {"num_disparities": 12, **opts})
        want = pipeline.run(left, right, params, cpu.CpuBackend()).disparity
        bk = cpu.CpuBackend()
        monkeypatch.setattr(bk, "CENSUS_ON_THE_FLY_CELLS", 0)
        got = pipeline.run(left, right, params, bk).disparity
        np.testing.assert_array_equal(got, want, err_msg=str(opts))
