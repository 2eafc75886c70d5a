"""The CUDA backend against the CPU backend: integer stages bit for bit, float stages
to a stated tolerance, the whole pipeline on small images. In CI the kernels run
under Numba's CUDA simulator; with STEREOCLI_TEST_GPU=1 on a GPU machine they run
for real, and the full Middlebury scenes are compared too."""
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import SAMPLE, SHARED_DATA, textured_pair

cuda = pytest.importorskip("numba.cuda")
from stereocli import config, io, pipeline  # noqa: E402
from stereocli.stages import cost  # noqa: E402
from stereocli.backends import cuda_status  # noqa: E402

if not cuda_status()[0]:
    pytest.skip("no CUDA backend (numba-cuda missing)", allow_module_level=True)

from stereocli.backends.cpu import CpuBackend  # noqa: E402
from stereocli.backends.cuda import CudaBackend  # noqa: E402
from stereocli.stages import preprocess  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
CPU, GPU = CpuBackend(), CudaBackend()
REAL_GPU = os.environ.get("STEREOCLI_TEST_GPU") == "1"
FLOAT_TOL = 1e-4  # float stages (DoG, bilateral, box means): relative, from FMA contraction on the GPU


def on_gpu(name, *args):
    dev = [GPU.upload(a) if isinstance(a, np.ndarray) else a for a in args]
    return GPU.download(getattr(GPU, name)(*dev))


def on_cpu(name, *args):
    return getattr(CPU, name)(*args)


@pytest.fixture
def imgs(rng):
    return (rng.integers(0, 256, (10, 16)).astype(np.float32), rng.integers(0, 256, (10, 16)).astype(np.float32))


@pytest.mark.parametrize("wx,wy,min_d,ndisp", [(9, 7, 0, 6), (5, 3, -2, 6), (9, 7, 0, 8), (7, 5, -3, 12)])
def test_census_volume_bit_exact(imgs, wx, wy, min_d, ndisp):
    """(D % 4 == 0 takes the GPU's packed four-disparity kernel.)"""
    L, R = imgs
    np.testing.assert_array_equal(on_gpu("census_volume", L, R, min_d, ndisp, wx, wy),
                                  on_cpu("census_volume", L, R, min_d, ndisp, wx, wy))


@pytest.mark.parametrize("min_d,ndisp", [(0, 16), (-5, 16), (7, 8), (2, 72)])
def test_census_volume_tiles_bit_exact(rng, min_d, ndisp):
    """D % 8 == 0 takes the kernel with a thread per left pixel and a block per run of
    them: rows wider than a block, disparities reaching past both image borders, more
    words per pixel than a thread computes between two writes (72)."""
    L, R = (rng.integers(0, 256, (5, 70)).astype(np.float32) for _ in range(2))
    np.testing.assert_array_equal(on_gpu("census_volume", L, R, min_d, ndisp, 9, 7),
                                  on_cpu("census_volume", L, R, min_d, ndisp, 9, 7))


def test_census_volume_at_the_largest_hamming_distance():
    """A bright dot on black against a flat right image: every bit differs, the cost
    scale's top (255), the same on both devices; and for every census size the scale's
    arithmetic (census_scale_magic) stays within a byte up to the largest distance."""
    L = np.zeros((9, 40), np.float32)
    L[4, 5::6] = 255.0  # dots: all of their neighbours darker, so all ones
    R = np.full((9, 40), 128.0, np.float32)  # flat: all zeros
    gpu = on_gpu("census_volume", L, R, 0, 16, 9, 7)
    np.testing.assert_array_equal(gpu, on_cpu("census_volume", L, R, 0, 16, 9, 7))
    assert gpu[4, 17, 3] == 255
    for nbits in range(8, 64):
        mul, add, shift = (int(v) for v in cost.census_scale_magic(nbits))
        assert (nbits * mul + add) >> shift <= 255


@pytest.mark.parametrize("wx,wy", [(9, 7), (5, 3), (7, 5), (1, 3), (7, 9), (31, 1), (3, 21)])
def test_census_strings_of_8bit_images_bit_exact(rng, wx, wy):
    """8-bit images (what the pipeline hands the census) take the kernel that compares
    four pixels at once: its strings are census_at's, bit for bit, for every window
    shape (tall ones go through the float kernel), on rows wider than a block, a width
    that is not a multiple of four, ties with the centre and both ends of the range."""
    L = rng.integers(0, 256, (9, 150)).astype(np.uint8)
    L[2, 10:40] = 0
    L[3, 20:60] = 255
    L[4, 30:45] = L[4, 37]  # a flat run: comparisons with equal neighbours give 0
    R = rng.integers(126, 131, (9, 150)).astype(np.uint8)  # many ties, around the top bit's edge
    cl, cr = GPU.census_strings(GPU.upload(L), GPU.upload(R), wx, wy)
    np.testing.assert_array_equal(GPU.download(cl), cost.census_transform_cpu(L, wx, wy))
    np.testing.assert_array_equal(GPU.download(cr), cost.census_transform_cpu(R, wx, wy))


def test_census_volume_of_8bit_images_bit_exact(rng):
    """The census volume from 8-bit images, 64 and 72 disparities over rows wider than
    that: runs of eight words whose right pixels all lie inside take the unrolled path
    (scale to cost units from the top byte), the others the checked one, both equal to
    the CPU's volume; a dot on black against a flat image reaches the largest distance."""
    L = rng.integers(0, 256, (7, 200)).astype(np.uint8)
    L[3, 150::6] = 255
    L[2:5, 148:] = np.where(L[2:5, 148:] == 255, 255, 0)
    R = rng.integers(0, 256, (7, 200)).astype(np.uint8)
    R[:, 80:] = 128
    for min_d, ndisp in ((0, 64), (-3, 72)):
        gpu = on_gpu("census_volume", L, R, min_d, ndisp, 9, 7)
        np.testing.assert_array_equal(gpu, on_cpu("census_volume", L, R, min_d, ndisp, 9, 7))
    assert gpu.max() == 255


def test_the_gpu_census_scale_gives_the_cpu_table():
    """The GPU's cost scale (top byte of a multiply-add) against the CPU's table, for
    every string size and every Hamming distance, without overflowing 32 bits."""
    from stereocli.backends.cuda.cost import census_scale_top
    for nbits in range(2, 65):
        mul, add = (int(v) for v in census_scale_top(nbits))
        h = np.arange(nbits + 1)
        assert nbits * mul + add < 1 << 32
        np.testing.assert_array_equal((h * mul + add) >> 24, cost.census_scale(nbits)[:nbits + 1])


@pytest.fixture(params=[1, 2, 3, 4], ids=lambda pf: f"prefetch{pf}")
def prefetch(request, monkeypatch):
    """The SGM kernel loading 1 to 4 pixels ahead (chosen by size otherwise; lines
    shorter than that depth included)."""
    from stereocli.backends.cuda import aggregate as kagg
    monkeypatch.setattr(kagg, "SGM_PREFETCH", request.param)


@pytest.mark.parametrize("paths", [4, 8, 16])
def test_sgm_bit_exact(rng, paths, prefetch):
    C = rng.integers(0, 256, (7, 9, 8)).astype(np.uint8)
    G = rng.integers(0, 256, (7, 9)).astype(np.uint8)
    np.testing.assert_array_equal(on_gpu("sgm", C, G, 20, 200, True, paths), on_cpu("sgm", C, G, 20, 200, True, paths))


@pytest.mark.skipif(not REAL_GPU, reason="the simulator runs one lane per path line")
@pytest.mark.parametrize("ndisp,paths", [(13, 8), (64, 8), (96, 4), (130, 8), (256, 16), (300, 8)])
def test_sgm_bit_exact_for_every_lane_grouping(rng, ndisp, paths, prefetch):
    """Groups of 1..32 lanes per path line (several lines per warp), vector and scalar
    access (D % 4), up to the CUDA limit of 512 disparities."""
    C = rng.integers(0, 256, (23, 37, ndisp)).astype(np.uint8)
    G = rng.integers(0, 256, (23, 37)).astype(np.uint8)
    np.testing.assert_array_equal(on_gpu("sgm", C, G, 20, 200, True, paths), on_cpu("sgm", C, G, 20, 200, True, paths))


def _poison_empty(monkeypatch):
    """The GPU backend's uninitialised arrays filled with a pattern that is not zeros by
    chance (a sum that nobody zeroed must be stored into, not added to)."""
    empty = GPU._empty

    def poisoned(shape, dtype):
        a = empty(shape, dtype)
        a.copy_to_device(np.full(a.shape, 0x5A5A5A5A, np.uint64).astype(a.dtype))
        return a
    monkeypatch.setattr(GPU, "_empty", poisoned)


@pytest.mark.parametrize("ndisp", [128, 256])
@pytest.mark.parametrize("first", ["on", "off"])
@pytest.mark.parametrize("rows", [3, 64])
@pytest.mark.parametrize("together", [True, False])
@pytest.mark.parametrize("lanes", [16, 32])
def test_sgm_in_bands_bit_exact(rng, monkeypatch, lanes, together, rows, first, ndisp):
    """The six vertical and diagonal paths walked in bands of rows, each band starting
    from the path costs the band before left (aggregate_bands: what the GPU runs for 8
    paths at 128 and 256 disparities from the KITTI size up; at 128 half a warp or a
    warp a walk, `lanes`), beside the horizontal pair or after it (first: the
    pair stores where it comes first, into a sum nobody zeroed): the CPU's sums, with
    bands shorter than the image and with one band; the sweeps from above and from
    below one after the other or at once on two streams (together)."""
    if not REAL_GPU and (ndisp == 128 or together or lanes == 16):
        pytest.skip("the simulator runs one small count (one lane a walk), on one stream")
    if ndisp != 128 and lanes == 16:
        pytest.skip("half a warp a walk only at 128 disparities")
    from stereocli.backends.cuda import aggregate_bands as kband
    monkeypatch.setattr(kband, "BANDS", "on")
    monkeypatch.setattr(kband, "BAND_ROWS", rows)
    monkeypatch.setattr(kband, "HFIRST", first)
    monkeypatch.setattr(kband, "SWEEPS_AT_ONCE", together)
    monkeypatch.setattr(kband, "LANES_128", lanes)
    if first == "on":  # and the kernel capped at 64 registers (a second wave otherwise: 3840x2160)
        monkeypatch.setattr(kband, "UNCAPPED_BLOCKS_PER_SM", 0)
    _poison_empty(monkeypatch)
    h, w, n = (40, 71, ndisp) if REAL_GPU else (7, 9, 8)  # (an odd width: a warp with a column and a side walk)
    C = rng.integers(0, 256, (h, w, n)).astype(np.uint8)
    G = rng.integers(0, 256, (h, w)).astype(np.uint8)
    np.testing.assert_array_equal(on_gpu("sgm", C, G, 20, 200, True, 8), on_cpu("sgm", C, G, 20, 200, True, 8))


@pytest.mark.parametrize("parts", [1, 3, 8])
def test_horizontal_pair_starts_on_the_census_rows_made_so_far(rng, monkeypatch, parts):
    """Where SGM runs the horizontal pair first (8 paths in bands, 1920x1080 / 256 and
    up), the GPU makes the census volume in parts of rows (census_codes,
    cost.cost_parts); the pair starts on a part's lines as soon as that part is made, on
    side streams, storing into a sum nobody zeroed, and each band adds after the pair's
    parts over its rows: the census volume and the SGM sums are the CPU's, whether the
    image's rows split evenly or not, and with more parts than the bands have rows. For
    4 paths whose vertical pair runs first, the GPU wants the stored volume."""
    from stereocli.backends.cuda import aggregate_bands as kband
    from stereocli.backends.cuda import cost as kcost
    n = 256 if REAL_GPU else 8
    monkeypatch.setattr(kband, "BANDS", "on")
    monkeypatch.setattr(kband, "HFIRST", "on")
    monkeypatch.setattr(kband, "UNCAPPED_BLOCKS_PER_SM", 0)
    monkeypatch.setattr(kcost, "COST_PARTS", parts)
    _poison_empty(monkeypatch)
    h, w = (41, 71) if REAL_GPU else (7, 12)
    L, R = (rng.integers(0, 256, (h, w)).astype(np.uint8) for _ in range(2))
    dL, dR = GPU.upload(L), GPU.upload(R)
    monkeypatch.setattr(kband, "BANDS4", "off")
    assert GPU.census_codes(dL, dR, 0, n, 9, 7, 4) is None  # (4 paths apart: the vertical pair first)
    vol = GPU.census_codes(dL, dR, 0, n, 9, 7, 8)
    assert (GPU._cost_rows is not None) == (parts > 1)
    cpu_vol = CPU.census_volume(L, R, 0, n, 9, 7)
    np.testing.assert_array_equal(GPU.download(vol), cpu_vol)
    sums = GPU.download(GPU.sgm(vol, dL, 20, 200, True, 8))
    assert GPU._cost_rows is None  # (taken by that SGM)
    np.testing.assert_array_equal(sums, CPU.sgm(cpu_vol, L, 20, 200, True, 8))


@pytest.mark.parametrize("ndisp,lanes", [(128, 16), (128, 32), (256, 32)])
@pytest.mark.parametrize("rows", [3, 64])
@pytest.mark.parametrize("parts", [1, 4])
def test_four_paths_in_bands_bit_exact(rng, monkeypatch, parts, rows, ndisp, lanes):
    """4 paths as the GPU runs them at large sizes: the horizontal pair first (storing
    into a sum nobody zeroed, in parts as the census volume is made), then the vertical
    pair in bands of one walk a group (at 128 disparities half a warp or a warp a walk,
    `lanes`), each band after the pair's parts over its rows, the selection following
    the bands: the CPU's sums and its left and right maps."""
    if not REAL_GPU and (ndisp == 256 or rows == 64 or lanes == 16):
        pytest.skip("the simulator runs one small count (one lane a walk), in short bands")
    from stereocli.backends.cuda import aggregate_bands as kband
    from stereocli.backends.cuda import cost as kcost
    monkeypatch.setattr(kband, "BANDS4", "on")
    monkeypatch.setattr(kband, "LANES_128_4", lanes)
    monkeypatch.setattr(kband, "BAND4_ROWS", rows)
    monkeypatch.setattr(kcost, "COST_PARTS", parts)
    _poison_empty(monkeypatch)
    n = ndisp if REAL_GPU else 8
    h, w = (41, 71) if REAL_GPU else (7, 12)
    L, R = (rng.integers(0, 256, (h, w)).astype(np.uint8) for _ in range(2))
    dL, dR = GPU.upload(L), GPU.upload(R)
    vol = GPU.census_codes(dL, dR, 0, n, 9, 7, 4)
    cpu_vol = CPU.census_volume(L, R, 0, n, 9, 7)
    cpu_sums = CPU.sgm(cpu_vol, L, 20, 200, True, 4)
    np.testing.assert_array_equal(GPU.download(GPU.sgm(vol, dL, 20, 200, True, 4)), cpu_sums)
    vol = GPU.census_codes(dL, dR, 0, n, 9, 7, 4)
    agg = GPU.sgm(vol, dL, 20, 200, True, 4)
    assert agg.ready  # (the selection follows the bands)
    for gpu_map, cpu_map in zip(GPU.select(agg, 0, 5.0, True, True)[:2], CPU.select(cpu_sums, 0, 5.0, True, True)[:2]):
        np.testing.assert_array_equal(GPU.download(gpu_map), cpu_map)


@pytest.mark.parametrize("ndisp,paths", [(64, 4), (128, 4), (256, 8)])
def test_sgm_bit_exact_at_the_largest_penalties(rng, ndisp, paths):
    """The largest P2 the config allows for the path count (the sum's uint16 bound),
    with P1 = P2 and with a small P1, and costs of 255: the GPU updates the path costs
    two to a 32-bit word (aggregate.SGM_PACKED), exact only while no 16-bit half
    overflows into the other: the CPU's sums."""
    p2 = config.max_p2(paths)
    h, w, n = (23, 41, ndisp) if REAL_GPU else (5, 7, 8)
    C = rng.integers(0, 256, (h, w, n)).astype(np.uint8)
    C[..., ::5] = 255
    G = rng.integers(0, 256, (h, w)).astype(np.uint8)
    for p1 in (p2, 7):
        np.testing.assert_array_equal(on_gpu("sgm", C, G, p1, p2, True, paths), on_cpu("sgm", C, G, p1, p2, True, paths))


@pytest.mark.skipif(not REAL_GPU, reason="the simulator runs one lane a line")
@pytest.mark.parametrize("first", ["on", "off"])
def test_sgm_horizontal_pair_eight_a_lane_at_128(rng, monkeypatch, first):
    """8 paths at 128 disparities as the GPU runs them at 1920x1080 and up: the
    horizontal pair with 8 disparities a lane (16 lanes a line), before or beside the
    bands: the CPU's sums."""
    from stereocli.backends.cuda import aggregate as kagg
    from stereocli.backends.cuda import aggregate_bands as kband
    monkeypatch.setattr(kband, "BANDS", "on")
    monkeypatch.setattr(kband, "HFIRST", first)
    monkeypatch.setattr(kagg, "SGM_HORIZONTAL_K8_MIN_CELLS", 0)
    assert kagg.sgm_shape(128, True)[:2] == (16, 8)
    _poison_empty(monkeypatch)
    C = rng.integers(0, 256, (40, 71, 128)).astype(np.uint8)
    G = rng.integers(0, 256, (40, 71)).astype(np.uint8)
    np.testing.assert_array_equal(on_gpu("sgm", C, G, 20, 200, True, 8), on_cpu("sgm", C, G, 20, 200, True, 8))


@pytest.mark.parametrize("ndisp", [8, 13, 256])
def test_sgm_pairs_apart_bit_exact(rng, monkeypatch, ndisp):
    """4 paths as the GPU runs them at large sizes: the vertical pair first, storing where
    it comes first into a sum nobody zeroed, then the horizontal pair adding: the CPU's
    sums (packed words and single values, D % 4)."""
    if not REAL_GPU and ndisp == 256:
        pytest.skip("the simulator runs one small count")
    from stereocli.backends.cuda import aggregate as kagg
    monkeypatch.setattr(kagg, "SGM_PAIRS_APART", "on")
    _poison_empty(monkeypatch)
    h, w = (40, 71) if REAL_GPU else (7, 9)
    C = rng.integers(0, 256, (h, w, ndisp)).astype(np.uint8)
    G = rng.integers(0, 256, (h, w)).astype(np.uint8)
    np.testing.assert_array_equal(on_gpu("sgm", C, G, 20, 200, True, 4), on_cpu("sgm", C, G, 20, 200, True, 4))


@pytest.mark.parametrize("paths", [4, 8])
def test_mgm_bit_exact(rng, paths):
    """MGM's wavefront of lines (each waits for the one before) gives the CPU's sums."""
    C = rng.integers(0, 256, (6, 9, 5)).astype(np.uint8)
    G = rng.integers(0, 256, (6, 9)).astype(np.uint8)
    np.testing.assert_array_equal(on_gpu("mgm", C, G, 20, 200, True, paths), on_cpu("mgm", C, G, 20, 200, True, paths))


@pytest.mark.skipif(not REAL_GPU, reason="large volumes: slow under the simulator")
@pytest.mark.parametrize("h,w,ndisp,paths", [(23, 37, 13, 8), (64, 200, 64, 8), (300, 41, 130, 4), (50, 60, 500, 8)])
def test_mgm_bit_exact_on_the_gpu(rng, h, w, ndisp, paths):
    """Many lines in flight at once (tall and wide images), several disparities a thread."""
    C = rng.integers(0, 256, (h, w, ndisp)).astype(np.uint8)
    G = rng.integers(0, 256, (h, w)).astype(np.uint8)
    want = on_cpu("mgm", C, G, 20, 200, True, paths)
    for _ in range(3):  # the wavefront's timing differs from run to run; the sums must not
        np.testing.assert_array_equal(on_gpu("mgm", C, G, 20, 200, True, paths), want)


@pytest.mark.skipif(REAL_GPU, reason="the simulator's multi-lane exchange; a GPU uses warp shuffles")
def test_sgm_lane_exchange_under_simulator():
    """The SGM kernel with 4 lanes per line (each holding 2 disparities) exchanges
    edge values and minima between lanes, and the selection kernel reduces over 4
    lanes per pixel; both must still equal the CPU."""
    code = (
        "import numpy as np;"
        "from stereocli.backends.cpu import CpuBackend;from stereocli.backends.cuda import CudaBackend;"
        "from stereocli.backends.cuda import common as K;assert K.SGM_LANES == 4;"
        "g=CudaBackend();r=np.random.default_rng(3);C=r.integers(0,256,(4,6,8)).astype(np.uint8);"
        "G=r.integers(0,256,(4,6)).astype(np.uint8);"
        "P=g.sgm(g.upload(C),g.upload(G),20,200,True,8);b=CpuBackend().sgm(C,G,20,200,True,8);"
        "assert np.array_equal(g.download(P),b), 'sgm differs';"
        "l,r,c=g.select(P,-1,10.0,True,True,True);L,R,Cf=CpuBackend().select(b,-1,10.0,True,True,True);"
        "assert np.array_equal(g.download(l),L,equal_nan=True) and np.array_equal(g.download(r),R,equal_nan=True) "
        "and np.array_equal(g.download(c),Cf), 'select differs'")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "STEREOCLI_SIM_LANES": "4"}
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.skipif(REAL_GPU, reason="the simulator's multi-lane exchange; a GPU uses warp shuffles")
def test_sgm_in_bands_lane_exchange_under_simulator():
    """The banded kernel with 4 lanes per walk (disparities interleaved across them in
    words of four): the six paths' sums of the CPU's vertical sweeps. (Alone: the line
    kernel of the horizontal pair takes at most 8 disparities with 4 simulated lanes.)"""
    code = (
        "import numpy as np;from stereocli.stages import aggregate as A;"
        "from stereocli.backends.cuda import CudaBackend;"
        "from stereocli.backends.cuda import aggregate_bands as B;assert B.L == 4 and B.BAND_ROWS == 2;"
        "g=CudaBackend();r=np.random.default_rng(5);h,w,n=5,6,32;C=r.integers(0,256,(h,w,n)).astype(np.uint8);"
        "G=r.integers(0,256,(h,w)).astype(np.uint8);t=A.p2_table(20,200,True);"
        "S=g.upload(np.zeros(h*w*n,np.uint32));"
        "g._sgm_bands(g.upload(C.ravel()),g.upload(G.ravel()),h,w,n,20,g.upload(t),S,False);"
        "want=np.zeros((h,w,n),np.uint16);A.sgm_vertical_cpu(C,G,np.int32(20),t,want,np.array([0,1,-1]));"
        "assert np.array_equal(g.download(S).reshape(h,w,n),want), 'sums differ'")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "STEREOCLI_SIM_LANES": "4", "STEREOCLI_SGM_BAND_ROWS": "2"}
    r = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]


def select_on_gpu(agg, *args):
    return tuple(None if a is None else GPU.download(a) for a in GPU.select(agg, *args))


@pytest.mark.parametrize("uniq,subpix", [(0.0, False), (10.0, True), (0.0, True)])
@pytest.mark.parametrize("min_d", [-1, 3, -12])  # (-12: right pixels no left pixel reaches)
def test_select_bit_exact(rng, uniq, subpix, min_d):
    """Left and right winner-takes-all on an aggregated volume (uint16 and uint8)."""
    for S in (rng.integers(0, 3000, (5, 12, 8)).astype(np.uint16), rng.integers(0, 256, (4, 9, 7)).astype(np.uint8)):
        got = select_on_gpu(GPU.upload(S), min_d, uniq, subpix, True, True)
        want = CPU.select(S, min_d, uniq, subpix, True, True)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    assert select_on_gpu(GPU.upload(S), min_d, uniq, subpix, False)[1:] == (None, None)


@pytest.mark.parametrize("ndisp", [8, 7])
def test_select_adds_the_sgm_directions(rng, ndisp):
    """Selection straight from the unsummed SGM direction volumes (packed when D % 4 == 0)."""
    C = rng.integers(0, 256, (6, 11, ndisp)).astype(np.uint8)
    G = rng.integers(0, 256, (6, 11)).astype(np.uint8)
    got = select_on_gpu(GPU.sgm(GPU.upload(C), GPU.upload(G), 20, 200, True, 8), -2, 10.0, True, True, True)
    want = CPU.select(CPU.sgm(C, G, 20, 200, True, 8), -2, 10.0, True, True, True)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("rows", [3, 64])
@pytest.mark.parametrize("first", ["on", "off"])
@pytest.mark.parametrize("together", [True, False])
def test_selection_of_the_rows_the_bands_finish(rng, monkeypatch, together, first, rows):
    """With SGM in bands the selection takes each range of rows as soon as both sweeps
    have finished it, on side streams, while the bands go on (select.SELECT_WITH_BANDS):
    the ranges cover every row once, and the maps are the CPU's (left, right,
    confidence), with the horizontal pair before or beside the bands, the sweeps at
    once or one after the other, and bands that do not divide the height."""
    if not REAL_GPU and together:
        pytest.skip("the simulator runs one stream")
    from stereocli.backends.cuda import aggregate_bands as kband
    from stereocli.backends.cuda import select as ksel
    monkeypatch.setattr(kband, "BANDS", "on")
    monkeypatch.setattr(kband, "BAND_ROWS", rows)
    monkeypatch.setattr(kband, "HFIRST", first)
    monkeypatch.setattr(kband, "SWEEPS_AT_ONCE", together)
    monkeypatch.setattr(ksel, "SELECT_WITH_BANDS", "on")
    h, w, n = (150, 71, 128) if REAL_GPU else (7, 9, 8)
    C = rng.integers(0, 256, (h, w, n)).astype(np.uint8)
    G = rng.integers(0, 256, (h, w)).astype(np.uint8)
    P = GPU.sgm(GPU.upload(C), GPU.upload(G), 20, 200, True, 8)
    covered = sorted((y0, y1) for y0, y1, _ in P.ready)
    assert [y for y0, y1 in covered for y in range(y0, y1)] == list(range(h))
    got = select_on_gpu(P, -2, 10.0, True, True, True)
    want = CPU.select(CPU.sgm(C, G, 20, 200, True, 8), -2, 10.0, True, True, True)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.skipif(not REAL_GPU, reason="needs a real GPU: wide rows, many disparities")
@pytest.mark.parametrize("w,ndisp,min_d", [(4500, 64, -20), (300, 256, 0), (2100, 128, -3), (200, 136, 5),
                                           (200, 130, 5), (5000, 40, 30)])
def test_select_bit_exact_on_wide_rows(rng, w, ndisp, min_d):
    """Rows wider than one block's segment of right pixels, and up to 256 disparities
    (packed words 4 or 8 a lane: select_words; 136: a lane's last words past the end)."""
    C = rng.integers(0, 256, (3, w, ndisp)).astype(np.uint8)
    G = rng.integers(0, 256, (3, w)).astype(np.uint8)
    got = select_on_gpu(GPU.sgm(GPU.upload(C), GPU.upload(G), 20, 200, True, 4), min_d, 5.0, True, True, True)
    want = CPU.select(CPU.sgm(C, G, 20, 200, True, 4), min_d, 5.0, True, True, True)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def noisy_map(rng, h=12, w=15):
    disp = rng.uniform(0, 8, (h, w)).astype(np.float32)
    disp[rng.random((h, w)) < 0.3] = np.nan
    return disp


def test_refinement_bit_exact(rng):
    disp, disp_r = noisy_map(rng), np.round(noisy_map(rng))
    np.testing.assert_array_equal(on_gpu("lr_check", disp, disp_r, 1.0), on_cpu("lr_check", disp, disp_r, 1.0))
    blocky = np.round(noisy_map(rng) / 3)
    np.testing.assert_array_equal(on_gpu("speckle", blocky, 5, 1.0), on_cpu("speckle", blocky, 5, 1.0))
    for mode in (1, 2):
        for shifted in (disp, disp - np.float32(8)):  # the left and the right border rules of the fill
            np.testing.assert_array_equal(on_gpu("fill", shifted, mode), on_cpu("fill", shifted, mode))
    for r in (1, 2):
        np.testing.assert_array_equal(on_gpu("median", disp, r), on_cpu("median", disp, r))


@pytest.mark.parametrize("h,w", [(9, 17), (37, 70)] + ([(200, 331)] if REAL_GPU else []))
def test_speckle_components_across_tiles(rng, h, w):
    """The GPU finds speckle components tile by tile, then joins them across the tile
    edges: regions spanning many tiles (a staircase of level steps, wider than max_diff
    in total but not from one pixel to the next), holes, and regions that touch only
    through another tile keep or lose their pixels exactly as on the CPU."""
    yy, xx = np.mgrid[0:h, 0:w]
    ramp = ((xx + 2 * yy) // 3).astype(np.float32) * np.float32(0.5)  # steps of 0.5: joined with max_diff 1
    blobs = np.round(rng.uniform(0, 6, (h, w))).astype(np.float32)  # small islands
    disp = np.where(rng.random((h, w)) < 0.5, ramp, blobs + np.float32(40))
    disp[rng.random((h, w)) < 0.1] = np.nan
    for max_size in (1, 4, 30):
        np.testing.assert_array_equal(on_gpu("speckle", disp, max_size, 1.0), on_cpu("speckle", disp, max_size, 1.0))


def test_fill_slope_identical(rng):
    """--fill slope: the GPU's kernels continue the border strip with the CPU's shared
    functions (fixed-point fits, so fused multiply-adds change nothing): the same map."""
    x = np.arange(90, dtype=np.float32)
    disp = np.tile(np.float32(30) + np.float32(0.15) * x, (12, 1))
    disp[:, :40] = np.nan
    disp[rng.random(disp.shape) < 0.2] = np.nan
    np.testing.assert_array_equal(on_gpu("fill", disp, 3), on_cpu("fill", disp, 3))


def test_fill_slope_medians_identical(rng):
    """The GPU ranks each run's window of slopes in parallel: rows of different slopes
    (medians of odd and even counts, ties), and a row with more run ends than a block
    takes together (the rest go one thread each) give the CPU's map."""
    x = np.arange(120, dtype=np.float32)
    slope = rng.choice(np.float32([0.05, 0.1, 0.2, 0.25]), (10, 1))
    disp = (np.float32(30) + slope * x + rng.normal(0, 0.05, (10, 120))).astype(np.float32)
    disp[:, :40] = np.nan
    disp[rng.random(disp.shape) < 0.15] = np.nan
    want = on_cpu("fill", disp, 3)
    np.testing.assert_array_equal(on_gpu("fill", disp, 3), want)
    assert np.isfinite(want[:, :30]).mean() > 0.5  # (the border strip was continued)
    many = np.tile(np.float32(200) + np.float32(0.1) * np.arange(240, dtype=np.float32), (2, 1))
    many[:, 1:170:2] = np.nan  # 85 runs a row, each ending where d > x
    np.testing.assert_array_equal(on_gpu("fill", many, 3), on_cpu("fill", many, 3))


def test_fill2d_identical(rng):
    """--fill 2d: the border strip, then the 8-direction fill, a thread a pixel."""
    disp = rng.uniform(0, 30, (16, 40)).astype(np.float32)
    disp[rng.random(disp.shape) < 0.5] = np.nan
    disp[:, :12] = np.nan
    np.testing.assert_array_equal(on_gpu("fill", disp, 4), on_cpu("fill", disp, 4))


def test_weighted_median_identical(rng):
    """The edge-aware weighted median: integer weights from one table, exact sums, so
    the same map on both devices (colour and grey guides, holes, image borders)."""
    x = np.arange(30)[None, :]
    disp = (np.where(x < 13 + rng.integers(-2, 3, (14, 1)), 12.0, 4.0) + rng.normal(0, 0.4, (14, 30)))
    disp = disp.astype(np.float32)
    disp[rng.random(disp.shape) < 0.1] = np.nan
    guide = rng.integers(0, 256, (14, 30, 3)).astype(np.uint8)
    guide[:, :11] //= 4
    for g, r in ((guide.reshape(14, -1), 4), (guide[:, :, 1].copy(), 3)):  # colour (rows of B, G, R), grey
        got, want = on_gpu("weighted_median", disp, g, r), on_cpu("weighted_median", disp, g, r)
        np.testing.assert_array_equal(got, want)
        assert not np.array_equal(want, disp)


@pytest.mark.skipif(not REAL_GPU, reason="many blocks: slow under the simulator")
def test_weighted_median_identical_over_many_blocks(rng):
    """A map of many kernel blocks, each listing its own edge pixels (some blocks none,
    some nearly all of them): the CPU's map."""
    h, w = 150, 260
    yy, xx = np.mgrid[:h, :w]
    disp = np.where((xx // 9 + yy // 7) % 2 == 0, 30.0, 6.0) + rng.normal(0, 0.3, (h, w))
    disp[:, 200:] = 10.0 + 0.02 * xx[:, 200:]  # a smooth part: no edges there
    disp = disp.astype(np.float32)
    disp[rng.random(disp.shape) < 0.05] = np.nan
    guide = rng.integers(0, 256, (h, w * 3)).astype(np.uint8)
    np.testing.assert_array_equal(on_gpu("weighted_median", disp, guide, 4), on_cpu("weighted_median", disp, guide, 4))


@pytest.mark.skipif(not REAL_GPU, reason="the simulator takes no kept buffers")
def test_slope_fill_at_alternating_sizes(rng):
    """The slope fill keeps its internal buffers for the next call of the same size: maps
    of other sizes in between (a batch of mixed sizes) still give the CPU's fill."""
    for h, w in [(40, 60), (50, 70), (40, 60), (300, 500), (40, 60)]:
        disp = rng.uniform(0, 30, (h, w)).astype(np.float32)
        disp[rng.random((h, w)) < 0.3] = np.nan
        disp[:, :8] = np.nan
        for mode in (3, 4):  # slope, 2-D
            np.testing.assert_array_equal(on_gpu("fill", disp, mode), on_cpu("fill", disp, mode))


def test_fill_long_rows_bit_exact(rng):
    """Rows much wider than the fill kernel's block: each thread takes a segment, and
    invalid runs cross segments, reach both borders, or fill a whole row."""
    disp = rng.uniform(-4, 40, (6, 301)).astype(np.float32)
    disp[rng.random(disp.shape) < 0.6] = np.nan
    disp[1, 20:200] = np.nan
    disp[2] = np.nan
    disp[3, :150] = np.nan
    disp[4, 150:] = np.nan
    for mode in (1, 2):
        np.testing.assert_array_equal(on_gpu("fill", disp, mode), on_cpu("fill", disp, mode))


def test_float_stages_within_tolerance(imgs):
    L, R = imgs
    k1, k2 = preprocess.gaussian_kernel(0.7), preprocess.gaussian_kernel(2.0)
    np.testing.assert_allclose(on_gpu("dog", L, k1, k2), on_cpu("dog", L, k1, k2), rtol=FLOAT_TOL, atol=1e-3)
    ss, sc = preprocess.bilateral_constants(2.0, 12.0)
    np.testing.assert_allclose(on_gpu("bilateral", L, 2, ss, sc), on_cpu("bilateral", L, 2, ss, sc),
                               rtol=FLOAT_TOL, atol=1e-3)
    vol = on_cpu("diff_volume", L, R, 0, 4, 0)
    np.testing.assert_array_equal(on_gpu("diff_volume", L, R, 0, 4, 0), vol)
    np.testing.assert_allclose(on_gpu("box_mean", vol, 2, 1), on_cpu("box_mean", vol, 2, 1), rtol=FLOAT_TOL, atol=1e-3)


def run_both(left, right, **opts):
    params = config.load("default", None, opts)
    a = pipeline.run(left, right, params, CPU).disparity
    b = pipeline.run(left, right, params, GPU).disparity
    return a, b


def same_maps(a, b):
    return np.isclose(a, b, atol=1e-5, rtol=0) | (np.isnan(a) & np.isnan(b))


def test_default_pipeline_identical_on_small_pair():
    left, right = textured_pair(h=30, w=40, shift=3, seed=11)
    a, b = run_both(left, right, num_disparities=8)
    assert same_maps(a, b).all()


def test_confidence_map_identical_on_both_devices():
    """The confidence, and the map that --min-confidence cuts from it, are the same on
    either device."""
    left, right = textured_pair(h=30, w=40, shift=3, seed=14)
    params = config.load("default", None, {"num_disparities": 8, "min_confidence": 0.3})
    a = pipeline.run(left, right, params, CPU, confidence=True)
    b = pipeline.run(left, right, params, GPU, confidence=True)
    np.testing.assert_array_equal(a.confidence, b.confidence)
    assert same_maps(a.disparity, b.disparity).all()
    assert 0 < np.isnan(a.disparity).mean() < 0.5


@pytest.mark.parametrize("opts", [
    {"cost": "sad", "paths": 4}, {"cost": "zncc", "aggregation": "none"},
    {"cost": "bt", "preprocess": "dog", "paths": 4}, {"cost": "mi", "paths": 4, "mi_levels": 1},
])
def test_other_costs_agree_on_small_pair(opts):
    """Float costs: rounding of a float mean to uint8 may differ by one unit where the
    GPU fuses a multiply-add, so a few pixels may differ; nearly all must agree."""
    left, right = textured_pair(h=24, w=36, shift=3, seed=12)
    a, b = run_both(left, right, num_disparities=8, **opts)
    assert same_maps(a, b).mean() > 0.98


@pytest.mark.skipif(not REAL_GPU, reason="full-size scenes need a real GPU")
@pytest.mark.parametrize("scene,ndisp", [("tsukuba", 16), ("venus", 32), ("teddy", 64), ("cones", 64)])
def test_full_scenes_identical_on_gpu(scene, ndisp):
    d = SHARED_DATA / scene if (SHARED_DATA / scene).exists() else SAMPLE
    left, right = io.read_image(d / "left.png"), io.read_image(d / "right.png")
    a, b = run_both(left, right, num_disparities=ndisp)
    assert same_maps(a, b).all()


@pytest.mark.skipif(not REAL_GPU, reason="the buffer pool is off under the simulator")
def test_pooled_buffers_do_not_leak_between_pairs():
    """The backend hands the device buffers of one pair to the next pair of the same
    size (a batch); each result must still be the CPU's, and the pool must be used."""
    pairs = [textured_pair(h=40, w=60, shift=s, seed=20 + s) for s in (2, 5, 2)]
    first = None
    for left, right in pairs:
        a, b = run_both(left, right, num_disparities=16)
        assert same_maps(a, b).all()
        if first is None:
            first = a
            assert GPU._pool.nbytes > 0  # the buffers came back
    assert same_maps(a, first).all()  # the same pair again, after another one


@pytest.mark.skipif(not REAL_GPU, reason="the buffer pool is off under the simulator")
def test_pairs_of_many_sizes_give_their_device_memory_back():
    """A batch of many sizes (a Middlebury tree) leaves each size's buffers in the pool;
    when an allocation fails the pool is emptied and the memory must come back to the
    device for the retry (the backend once kept the first buffer of every shape). What
    counts is this process's device allocations (Numba's memory manager keeps each live
    one), not the device's free memory, which another process on the GPU moves."""
    import gc
    from numba.cuda.cudadrv.driver import AutoFreePointer
    ctx = cuda.current_context()
    bk = CudaBackend()
    params = config.load("default", None, {"num_disparities": 128})

    def held_after_release():
        gc.collect()
        bk.synchronize()
        bk._pool.release()  # what an allocation that fails does before it tries again
        ctx.deallocations.clear()
        live = list(ctx.memory_manager.allocations.values())
        return sum(m.size for m in live if isinstance(m, AutoFreePointer))

    before = held_after_release()
    for i in range(5):  # 600 x 800-832 / 128: about 180 MB of volumes each
        left, right = textured_pair(h=600, w=800 + 8 * i, shift=4, seed=i)
        pipeline.run(left.astype(np.uint8), right.astype(np.uint8), params, bk)
    leaked = held_after_release() - before
    assert leaked < 64 << 20, f"{leaked / 2**20:.0f} MiB of device memory not given back"


@pytest.mark.skipif(not REAL_GPU, reason="the launcher's own path is off under the simulator")
def test_a_kernel_compiled_at_its_first_launch_lets_the_callers_arrays_go():
    """A kernel compiles at its first launch, and Numba's type inference leaves
    reference cycles through the frames on the stack: compiled there, the caller's
    arrays (a match's images and its pinned map) stayed alive until Python's next full
    collection. They must go as soon as the caller drops them."""
    import gc
    import weakref
    from stereocli.backends.cuda.launch import Launcher

    @cuda.jit(cache=False)  # this test's own kernel: it compiles at its first launch below
    def clamp(a, n, out):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = min(a[i], np.float32(n))

    def first_launch():
        host = np.arange(64, dtype=np.float32)  # an array of the caller's
        a, out = GPU.upload(host), GPU.upload(np.zeros(64, np.float32))
        Launcher().launch(clamp, (1,), (64,), GPU.stream, a, 5, out)
        np.testing.assert_array_equal(GPU.download(out), np.minimum(host, 5))
        return weakref.ref(host)

    gc.disable()  # (a collection would break the cycles and hide them)
    try:
        assert first_launch()() is None
    finally:
        gc.enable()


@pytest.mark.skipif(not REAL_GPU, reason="the pinned result maps are off under the simulator")
def test_a_kept_map_is_not_overwritten_by_later_matches():
    """Maps come back in pinned buffers that are used again once dropped (from the
    third match of a size on, a replayed graph's download is pointed at each one): a map
    (or only a view of it) that the caller keeps must stay as it was while later pairs
    of the same size are matched, and each map must be the CPU's."""
    from stereocli.backends.cuda import graphs, hostmem
    pairs = [tuple(np.ascontiguousarray(a.astype(np.uint8)) for a in textured_pair(h=400, w=1400, shift=s, seed=s))
             for s in (3, 9)]
    params = config.load("default", None, {"num_disparities": 16})
    first = pipeline.run(*pairs[0], params, GPU).disparity
    assert hostmem.is_pinned(first) and hostmem.is_pinned(first[100:])  # (else this test tests nothing)
    kept_view, kept = first[100:], first[100:].copy()
    del first
    for k in range(4):
        m = pipeline.run(*pairs[(k + 1) % 2], params, GPU).disparity
        assert same_maps(m, pipeline.run(*pairs[(k + 1) % 2], params, CPU).disparity).all()
        del m
        np.testing.assert_array_equal(kept_view, kept)
    assert any(isinstance(g, graphs.Graph) and g._copy is not None for g in GPU._graphs.values())  # (replayed)


@pytest.mark.skipif(not REAL_GPU, reason="the staging buffers are off under the simulator")
def test_uploads_queued_together_each_arrive_whole(rng):
    """Uploads go through a few pinned buffers used in turn, without waiting for the GPU:
    more uploads than buffers, of several sizes, queued behind slow work, must each
    arrive as they were (a buffer refilled before its copy left would mix them)."""
    C = rng.integers(0, 256, (400, 600, 64)).astype(np.uint8)
    G = rng.integers(0, 256, (400, 600)).astype(np.uint8)
    C, G = GPU.upload(C), GPU.upload(G)
    GPU.synchronize()
    sizes = (1000, 5000, 300_000, 1000, 200_000, 50, 250_000, 7, 3_000_000)  # two rounds of the buffers, and one
    hosts = [rng.random(n).astype(np.float32) for n in sizes]  # larger than they take
    busy = [GPU.sgm(C, G, 20, 200, True, 16) for _ in range(2)]
    del busy
    devs = [GPU.upload(a) for a in hosts]  # (the device buffers of these sizes: then in the pool)
    del devs
    GPU.synchronize()
    busy = [GPU.sgm(C, G, 20, 200, True, 16) for _ in range(2)]  # the stream busy while the uploads are queued
    devs = [GPU.upload(a[::-1]) for a in hosts]
    for a, d in zip(hosts, devs):
        np.testing.assert_array_equal(GPU.download(d), a[::-1])
    del busy


@pytest.mark.skipif(not REAL_GPU, reason="the direct uploads are off under the simulator")
def test_inputs_uploaded_in_pieces_arrive_whole(rng):
    """A match's images go up in pieces of a pinned buffer, copied by host threads, when
    they are large (UPLOAD_PIECES_MIN_BYTES, from two 1920x1080 images): every byte
    arrives in its place, for sizes that are no multiple of a piece, twice in a row
    (the buffer reused once its copies have left)."""
    GPU.synchronize()
    for shape in ((1080, 1920), (1081, 1923), (2160, 3840)):
        for _ in range(2):
            a, b = (rng.integers(0, 256, shape).astype(np.uint8) for _ in range(2))
            assert a.nbytes + b.nbytes >= GPU.UPLOAD_PIECES_MIN_BYTES and GPU._stream_idle()  # (the pieces' path)
            da, db = GPU.upload_inputs(a, b)
            np.testing.assert_array_equal(GPU.download(da), a)
            np.testing.assert_array_equal(GPU.download(db), b)


@pytest.mark.skipif(not REAL_GPU, reason="the ordering events are the simulator's own")
def test_matches_in_a_row_reuse_the_ordering_events_and_agree():
    """The streams of a match are ordered by events that the next match reuses (a free
    list refilled at each synchronize): three 4-path and 8-path matches in a row at
    1920x1080 / 128 (the horizontal pair in parts, then bands, the selection following
    them), the later ones on reused events, each give the CPU's map."""
    import cv2
    d = SHARED_DATA / "cones" if (SHARED_DATA / "cones").exists() else SAMPLE
    left, right = (cv2.resize(io.read_image(d / f), (1920, 1080), interpolation=cv2.INTER_CUBIC)
                   for f in ("left.png", "right.png"))
    for paths in (4, 8):
        params = config.load("default", None, {"num_disparities": 128, "paths": paths})
        cpu = pipeline.run(left, right, params, CPU).disparity
        made = None
        for _ in range(3):
            assert same_maps(cpu, pipeline.run(left, right, params, GPU).disparity).all()
            free = len(GPU._order_free)
            assert made is None or free == made  # the same events again, none made anew
            made = free


@pytest.mark.skipif(not REAL_GPU, reason="the buffer pool is off under the simulator")
def test_a_slice_keeps_its_buffer_from_the_pool():
    """A buffer goes back to the pool when the last array over it is garbage: a slice
    that outlives the array it was cut from still owns its values."""
    import gc
    a = GPU.upload(np.arange(1000, dtype=np.float32))
    part = a[100:110]
    del a
    gc.collect()
    b = GPU.upload(np.full(1000, -1, np.float32))  # would take a's buffer if it had gone back
    np.testing.assert_array_equal(GPU.download(part), np.arange(100, 110, dtype=np.float32))
    np.testing.assert_array_equal(GPU.download(b), -1)


@pytest.mark.skipif(not REAL_GPU, reason="graphs are off under the simulator")
@pytest.mark.parametrize("overrides", [{}, {"weighted_median": 0, "fill": "background"}])
def test_replayed_graphs_give_each_pair_its_own_map(rng, overrides):
    """From the second pair of a size on, the backend replays a captured graph of the
    match: each pair's own images must go in (not those of the capture), and the maps
    and the stages timed must be those of an ordinary run."""
    from stereocli.backends.cuda import graphs
    bk, plain = CudaBackend(), CudaBackend()
    plain.graphs = False
    params = config.load("default", None, {"num_disparities": 24, **overrides})
    scenes = []
    for shift in (3, 7, 11):
        left = rng.integers(0, 256, (70, 110, 3)).astype(np.uint8)
        left = np.repeat(np.repeat(left[::2, ::2], 2, 0), 2, 1)[:70, :110]  # (blobs: some valid matches)
        scenes.append((left, np.ascontiguousarray(np.roll(left, -shift, axis=1))))
    for i in (0, 1, 0, 2, 1, 2, 0):
        got = pipeline.run(*scenes[i], params, bk)
        want = pipeline.run(*scenes[i], params, plain)
        np.testing.assert_array_equal(got.disparity, want.disparity)
        assert got.timings.keys() == want.timings.keys() and all(v >= 0 for v in got.timings.values())
    assert any(isinstance(g, graphs.Graph) for g in bk._graphs.values())
    assert not any(isinstance(g, graphs.Graph) for g in plain._graphs.values())


@pytest.mark.skipif(not REAL_GPU, reason="graphs are off under the simulator")
@pytest.mark.parametrize("first", ["on", "off"])
def test_replayed_graphs_keep_the_selection_that_follows_the_bands(rng, monkeypatch, first):
    """A match whose selection follows SGM's bands (select.SELECT_WITH_BANDS: launches on
    side streams that wait on each band's event, and on the horizontal pair's beside the
    bands) is captured and replayed like any other: every replay gives the CPU's map."""
    from stereocli.backends.cuda import aggregate_bands as kband
    from stereocli.backends.cuda import graphs
    from stereocli.backends.cuda import select as ksel
    monkeypatch.setattr(kband, "BANDS", "on")
    monkeypatch.setattr(kband, "BAND_ROWS", 16)
    monkeypatch.setattr(kband, "HFIRST", first)
    monkeypatch.setattr(ksel, "SELECT_WITH_BANDS", "on")
    bk = CudaBackend()
    params = config.load("default", None, {"num_disparities": 128})
    scenes = [tuple(np.clip(a, 0, 255).astype(np.uint8) for a in textured_pair(h=90, w=300, shift=s, seed=s))
              for s in (5, 9)]
    for i in (0, 1, 0, 1, 0):
        got = pipeline.run(*scenes[i], params, bk)
        want = pipeline.run(*scenes[i], params, CPU)
        assert same_maps(got.disparity, want.disparity).all()
    assert any(isinstance(g, graphs.Graph) for g in bk._graphs.values())


@pytest.mark.skipif(not REAL_GPU, reason="graphs are off under the simulator")
def test_replayed_graphs_read_page_locked_inputs_where_they_are(rng):
    """A batch's read slots are page-locked (pin_host) and a replayed graph uploads a
    pair from there instead of copying it: whichever buffer the next pair lies in (the
    same one refilled, another, ordinary memory), its own map comes out."""
    import mmap
    bk, plain = CudaBackend(), CudaBackend()
    plain.graphs = False
    params = config.load("default", None, {"num_disparities": 24})
    h, w = 70, 110
    slots = [mmap.mmap(-1, 1 << 20) for _ in range(2)]
    unpins = [bk.pin_host(m) for m in slots]
    assert all(u is not None for u in unpins)

    def in_slot(k, left, right):
        inp = io.prepare_pair(left, right)
        views = [np.ndarray((h, w), np.uint8, buffer=slots[k], offset=o) for o in (0, h * w)]
        views[0][...], views[1][...] = inp.grey_left, inp.grey_right
        return io.PairInput(left, views[0], views[1])

    try:
        for i, k in enumerate((0, 0, 1, 0, None, 1, 1)):
            left = rng.integers(0, 256, (h, w, 3)).astype(np.uint8)
            left = np.repeat(np.repeat(left[::2, ::2], 2, 0), 2, 1)[:h, :w]
            right = np.ascontiguousarray(np.roll(left, -(3 + i), axis=1))
            inp = io.prepare_pair(left, right) if k is None else in_slot(k, left, right)
            got = pipeline.run_prepared(inp, params, bk)
            want = pipeline.run(left, right, params, plain)
            np.testing.assert_array_equal(got.disparity, want.disparity)
    finally:
        for u in unpins:
            u()


@pytest.mark.skipif(not REAL_GPU, reason="a batch of real pairs needs a real GPU")
def test_gpu_batch_in_worker_processes_writes_the_cpu_maps(tmp_path):
    """stereo batch --device cuda --io-processes: the pairs come from page-locked slots
    that the workers fill; every map is the CPU's (same PNG bytes)."""
    import cv2
    from stereocli import batch
    for d in ("left", "right"):
        (tmp_path / d).mkdir()
    for i, (scene, _) in enumerate([("tsukuba", 16), ("venus", 32), ("teddy", 64), ("cones", 64)] * 2):
        for d, f in (("left", "left.png"), ("right", "right.png")):
            img = cv2.imread(str(SHARED_DATA / scene / f))
            cv2.imwrite(str(tmp_path / d / f"{i:02d}_{scene}.png"), img)
    params = config.load("default", None, {"num_disparities": 32})
    outs = {}
    for name, bk, procs in (("gpu", GPU, 2), ("cpu", CPU, 0)):
        pairs = batch.find_pairs(tmp_path / "left", tmp_path / "right", tmp_path / name, ".png")
        s = batch.run(pairs, params, bk, ".png", threads=2, processes=procs)
        assert s.done == len(pairs) == 8 and s.failed == 0
        outs[name] = {p.name: p.read_bytes() for p in sorted((tmp_path / name).iterdir())}
    assert outs["gpu"] == outs["cpu"]


def test_non_finite_input_pixels_give_the_same_invalid_map_on_both_devices():
    left, right = textured_pair(h=24, w=36, shift=3, seed=13)
    left[5, 10] = np.nan
    left[7:9, 20] = np.inf
    right[12, 15] = -np.inf
    a, b = run_both(left, right, num_disparities=8)
    assert np.isnan(a[5, 10]) and np.isnan(a[7:9, 20]).all()
    assert same_maps(a, b).all()


@pytest.mark.skipif(not REAL_GPU, reason="a 6000x4000 pair needs a real GPU")
def test_large_pair_in_strips_is_identical_on_cpu_and_gpu():
    """6000x4000 with 320 disparities: more than one standard strip. The strip layout
    depends on the image, not the device's memory, so the maps are equal bit for bit."""
    import cv2
    rng = np.random.default_rng(7)
    h, w = 4000, 6000
    base = cv2.GaussianBlur(rng.integers(0, 256, (h, w + 320)).astype(np.float32), (5, 5), 1.2)
    base = np.clip(base, 0, 255).astype(np.uint8)
    left = np.ascontiguousarray(base[:, :w])
    right = np.empty_like(left)
    for y0 in range(0, h, 500):  # bands of disparity 40, 70, ..., 250: right(x) = left(x + d)
        d = 40 + 30 * (y0 // 500)
        right[y0:y0 + 500] = base[y0:y0 + 500, d:d + w]
    params = config.load("default", None, {"num_disparities": 320})
    a = pipeline.run(left, right, params, CPU)
    b = pipeline.run(left, right, params, GPU)
    assert a.strips == b.strips > 1 and not a.notes and not b.notes
    assert same_maps(a.disparity, b.disparity).all()


@pytest.mark.skipif(not REAL_GPU, reason="many strips of a pinned map: a real GPU (slow under the simulator)")
def test_every_strip_lands_in_the_map_when_the_host_does_not_wait_for_each():
    """Under --max-memory a pair runs in many strips, whose maps are copied into the
    pinned result without the host waiting for each: when run returns, every strip's
    rows are there, also in a second match made while the first's map is still held."""
    left, right = (np.clip(a, 0, 255).astype(np.uint8) for a in textured_pair(h=400, w=320, shift=9, seed=5))
    params = config.load("default", None, {"num_disparities": 32, "max_memory": 4})
    a = pipeline.run(left, right, params, CPU)
    first = pipeline.run(left, right, params, GPU)
    second = pipeline.run(left, right, params, GPU)
    assert a.strips == first.strips >= 8
    assert same_maps(a.disparity, first.disparity).all()
    assert same_maps(a.disparity, second.disparity).all()


def test_both_backends_provide_every_operation_of_the_protocol():
    """backends/protocol.py declares what pipeline.run calls; each backend has every
    operation, with the same parameters."""
    import inspect

    from stereocli.backends.protocol import Backend
    ops = [n for n, f in vars(Backend).items() if inspect.isfunction(f) and not n.startswith("_")]
    assert len(ops) > 20
    for backend in (CPU, GPU):
        assert backend.name in ("cpu", "cuda")
        for op in ops:
            want = list(inspect.signature(getattr(Backend, op)).parameters)[1:]
            got = list(inspect.signature(getattr(backend, op)).parameters)
            assert got == want, (type(backend).__name__, op)
