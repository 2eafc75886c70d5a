"""Batch throughput: the shared scenes repeated to N pairs (default 200) in a temporary
KITTI-like tree, run through `stereocli.batch` exactly as `stereo batch` runs them
(the file work overlapped with the matching). Prints one JSON line with
pairs/s, the summed read / compute / write ms and the share of time in I/O, after
one warm-up pair (kernel compile/cache load excluded). A "bounds" line says what
bounds that rate, from two runs in the same process: the same batch with the
matching taken out (each pair's map is a precomputed one of its size, so only the
reads, encodes and writes remain: codec_only_pairs_per_s) and the matching alone,
one pair after another on images already decoded and made grey, as the readers hand
them on (match_only_pairs_per_s); `bound` is the slower of the two and `overlap` the
batch's rate over that one's (1.0: the other work hides entirely behind it). A peer
line times the plain serial loop a user would write with OpenCV StereoSGBM (read,
compute, write PNG) on the same pairs in the same process (CPU only).

The file work runs where `stereo batch` runs it by default (--io-processes auto: in
worker processes for a GPU batch on 8 cores or more, else in threads), or in N worker
processes with --io-processes N (0: threads). warm_up_s is the first pair's batch:
kernels loaded (or compiled), worker processes started.

    python benchmarks/batch.py [DATA_DIR] [--pairs 200] [--device cpu|cuda] [-n 64] [--threads N]
                               [--io-processes N|auto] [--png-compression fast|small] [--quick]
"""
import argparse
import shutil
import tempfile
import time
from pathlib import Path

import cv2

from common import DATA, SCENES, emit, opencv_disparity, opencv_sgbm

from stereocli import batch, config, io
from stereocli.backends import get_backend


def build_tree(data: Path, root: Path, n: int):
    (root / "left").mkdir(parents=True)
    (root / "right").mkdir()
    for i in range(n):
        scene = SCENES[i % len(SCENES)][0]
        shutil.copyfile(data / scene / "left.png", root / "left" / f"{i:06d}_{scene}.png")
        shutil.copyfile(data / scene / "right.png", root / "right" / f"{i:06d}_{scene}.png")


def bounds(root: Path, pairs, params, backend, ext: str, threads: int, processes: int, rate: float, png: str):
    """The "bounds" line (module docstring): the batch without its matching, and the
    matching without the batch."""
    from stereocli import pipeline
    images, maps = [], {}
    for p in pairs[:len(SCENES)]:
        inp, _ = batch.load_prepared(p)  # (decoded and made grey, as the batch's readers hand pairs on)
        images.append(inp)
        maps[inp.shape] = pipeline.run_prepared(inp, params, backend)

    def precomputed(fn, inp, *args, **kw):
        return maps[inp.shape]

    again = batch.find_pairs(root / "left", root / "right", root / "codec_only", ext)
    t = time.perf_counter()
    s = batch.run(again, params, backend, ext, threads=threads, processes=processes, compute=precomputed, png=png)
    codec = s.done / (time.perf_counter() - t)
    n = min(len(pairs), 400)
    t = time.perf_counter()
    for i in range(n):
        pipeline.run_prepared(images[i % len(images)], params, backend)
    match = n / (time.perf_counter() - t)
    slower = min(codec, match)
    emit(bench="stereo batch bounds", device=backend.name, threads=threads, io_processes=processes, pairs_per_s=round(rate, 2),
         codec_only_pairs_per_s=round(codec, 2), match_only_pairs_per_s=round(match, 2), match_only_pairs=n,
         bound="codec" if codec < match else "matching", overlap=round(rate / slower, 3))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?", default=str(DATA))
    ap.add_argument("--pairs", type=int, default=200)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("-n", "--num-disparities", type=int, default=64)
    ap.add_argument("--threads", type=int, help="reader and writer threads [as stereo batch: one per core, 4 to 16]")
    ap.add_argument("--io-processes", default="auto",
                    help="worker processes for the file work (0: threads; auto: as stereo batch picks, "
                         "batch.auto_io_processes)")
    ap.add_argument("--format", default="png")
    ap.add_argument("--png-compression", choices=io.PNG_COMPRESSIONS, default=batch.PNG_DEFAULT,
                    help="how the PNG maps are written [as stereo batch: %(default)s]")
    ap.add_argument("--preset", default="default")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--no-bounds", action="store_true", help="skip the runs behind the bounds line")
    ap.add_argument("--quick", action="store_true", help="4 pairs, 16 disparities (a check that the script runs)")
    a = ap.parse_args()
    if a.quick:
        a.pairs, a.num_disparities = 4, 16
    params = config.load(a.preset, None, {"num_disparities": a.num_disparities})
    backend = get_backend(a.device)
    a.io_processes = (batch.auto_io_processes(backend.name == "cuda", a.pairs) if a.io_processes == "auto"
                      else int(a.io_processes))
    a.threads = a.threads or batch.default_threads()
    ext = "." + a.format
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_tree(Path(a.data), root, a.pairs)
        warm = batch.find_pairs(root / "left", root / "right", root / "warm", ext)[:1]
        t = time.perf_counter()  # compile / load the kernel cache, start the worker processes
        batch.run(warm, params, backend, ext, threads=a.threads, processes=a.io_processes, png=a.png_compression)
        warm_s = time.perf_counter() - t
        pairs = batch.find_pairs(root / "left", root / "right", root / "out", ext)
        t = time.perf_counter()
        s = batch.run(pairs, params, backend, ext, threads=a.threads, processes=a.io_processes, png=a.png_compression)
        wall = time.perf_counter() - t
        io_ms = s.read_ms + s.write_ms
        emit(bench="stereo batch", device=backend.name, describe=backend.describe(), pairs=len(pairs),
             done=s.done, failed=s.failed, num_disparities=a.num_disparities, preset=a.preset, threads=a.threads,
             io_processes=a.io_processes, warm_up_s=round(warm_s, 3),
             format=a.format, png_compression=a.png_compression, wall_s=round(wall, 3), pairs_per_s=round(s.done / wall, 2),
             read_ms=round(s.read_ms, 1), compute_ms=round(s.compute_ms, 1), write_ms=round(s.write_ms, 1),
             io_share=round(io_ms / (io_ms + s.compute_ms), 3),
             compute_busy=round(s.compute_ms / (wall * 1e3), 3))
        if not a.no_bounds:
            bounds(root, pairs, params, backend, ext, a.threads, a.io_processes, s.done / wall, a.png_compression)
        if a.no_peer:
            return
        sgbm = opencv_sgbm(a.num_disparities)
        (root / "cv").mkdir()
        t = time.perf_counter()
        for p in pairs:
            gl = cv2.imread(p.left, cv2.IMREAD_GRAYSCALE)
            gr = cv2.imread(p.right, cv2.IMREAD_GRAYSCALE)
            io.write_disparity(root / "cv" / Path(p.output).name, opencv_disparity(sgbm, gl, gr))
        wall_cv = time.perf_counter() - t
        emit(bench="opencv sgbm serial loop", pairs=len(pairs), num_disparities=a.num_disparities,
             wall_s=round(wall_cv, 3), pairs_per_s=round(len(pairs) / wall_cv, 2))


if __name__ == "__main__":
    main()
