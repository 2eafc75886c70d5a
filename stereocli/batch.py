"""Many pairs: find and pair the files, then match them with I/O overlapped with compute.

Pairing (`find_pairs`)
  LEFT_DIR and RIGHT_DIR hold files of the same name (default), or files that match
  `left_glob` / `right_glob`. A pattern's wildcards (`*`, `?`, `[..]`, `**`) form the
  pairing key: `*_10.png` pairs image_2/000123_10.png with image_3/000123_10.png;
  `*/im0.png` + `*/im1.png` pair by folder (Middlebury). `{name}` marks the part
  that is the key (and the output name): `left_{name}.png` + `right_{name}.png`.
  The output is OUT_DIR/<left file stem>.<ext>, keeping sub-folders the pattern
  spans; when the file name is fixed (`*/im0.png`) it is the folder's: <scene>.<ext>.
  `read_pairs_file` takes lines `left<TAB>right[<TAB>output]` instead.

Running (`run`)
  Decoding (and the grey conversion: codecs.load_prepared) runs a few pairs ahead,
  encoding/writing (and the ground-truth evaluation) behind, while the calling thread
  runs the matcher (CPU or GPU) on one pair after another; the backend, and so the
  compiled kernels, are shared by all pairs. The file work runs in reader and writer
  threads, or with `processes` in worker processes (codecs.Workers: a GPU batch of
  small pairs is bound by it, and threads share this process's interpreter lock with
  the matching). Every pair ends as one event (a dict) passed to
  `on_event`: status ok / failed / skipped, paths, per-stage ms, metrics.
"""
from __future__ import annotations

import os
import queue
import re
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import cv2

from . import io, metrics, pipeline
from . import codecs
from .codecs import load_pair, load_prepared, save_result  # noqa: F401  (also this module's API)
from .errors import StereoError, raise_interrupt

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".pgm", ".ppm", ".pnm", ".webp"}


@dataclass
class Pair:
    left: str
    right: str | None  # None: `left` is one side-by-side frame
    output: str  # a local path or an fsspec URL
    key: str = ""
    gt: Path | None = None
    error: str | None = None  # known bad before any work (no partner, bad line)
    time_file: str | None = None  # also write the seconds the match took here (Middlebury submissions)
    extras: dict | None = None  # preview / depth / ply / confidence / error-map paths, the camera (with_extras)

    @property
    def wants_confidence(self) -> bool:
        return bool(self.extras and self.extras.get("confidence"))


SUBMISSIONS = ("kitti", "middlebury")

# A batch's PNG maps are stored, not deflated (io.PNG_COMPRESSIONS): on a GPU the encode
# was a third of the codec time that bounds a batch. H200 machine, 16 cores,
# `benchmarks/batch.py --device cuda --pairs 4000`, pairs/s in two rounds alternated:
# deflated 715 / 746, stored 905 / 847 (the codec alone 742 / 734 -> 947 / 919).
PNG_DEFAULT = "fast"


def as_submission(pairs, kind: str, out_dir, method: str = "stereocli"):
    """Re-aim each pair's output at the layout a benchmark's devkit reads, under out_dir:
    KITTI 2012/2015 `disp_0/NAME.png` (16-bit, d * 256, 0 = invalid); Middlebury 2014
    `NAME/disp0METHOD.pfm` with `NAME/timeMETHOD.txt` (seconds for the pair). NAME is
    the pair's output name (the scene folder with --left-glob '*/im0.png')."""
    for p in pairs:
        name = PurePosixPath(p.output).stem
        if kind == "kitti":
            p.output = io.join(out_dir, f"disp_0/{name}.png")
        else:
            p.output = io.join(out_dir, f"{name}/disp0{method}.pfm")
            p.time_file = io.join(out_dir, f"{name}/time{method}.txt")
        yield p


@dataclass
class Summary:
    done: int = 0
    failed: int = 0
    skipped: int = 0
    interrupted: bool = False
    seconds: float = 0.0
    failures: list = field(default_factory=list)  # (left, error)
    metric_counts: dict | None = None  # summed metrics.counts over evaluated pairs
    evaluated: int = 0
    read_ms: float = 0.0
    compute_ms: float = 0.0
    write_ms: float = 0.0
    startup_s: float | None = None  # on a Dask cluster: until the workers were ready
    workers: dict = field(default_factory=dict)  # on a Dask cluster: worker -> {"ok", "failed", "skipped", "compute_ms"}
    io_processes: int | None = None  # in one process: the worker processes of the file work (0: threads)

    def record(self, ev: dict, counts: dict | None = None) -> dict:
        """Count one finished pair (its event dict) and return the event, with metrics added."""
        status = ev["status"]
        if ev.get("worker"):
            w = self.workers.setdefault(ev["worker"], {"ok": 0, "failed": 0, "skipped": 0, "compute_ms": 0.0})
            w[status] += 1
            w["compute_ms"] = round(w["compute_ms"] + ev.get("compute_ms", 0.0), 1)
        if status == "ok":
            self.done += 1
            self.read_ms += ev.get("read_ms", 0.0)
            self.compute_ms += ev.get("compute_ms", 0.0)
            self.write_ms += ev.get("write_ms", 0.0)
            if counts is not None:
                self.metric_counts = metrics.add(self.metric_counts, counts)
                self.evaluated += 1
                ev["metrics"] = metrics.rounded(metrics.summarize(counts))
        elif status == "skipped":
            self.skipped += 1
        else:
            self.failed += 1
            self.failures.append((ev["left"], ev.get("error", "")))
        return ev

    def reporter(self, on_event):
        """report(ev, counts=None): count a finished pair, then pass its event to `on_event`."""
        on_event = on_event or (lambda ev: None)
        return lambda ev, counts=None: on_event(self.record(ev, counts))

    @property
    def total(self) -> int:
        return self.done + self.failed + self.skipped

    def as_dict(self) -> dict:
        out = {"done": self.done, "failed": self.failed, "skipped": self.skipped,
               "interrupted": self.interrupted, "seconds": round(self.seconds, 3),
               "pairs_per_s": round(self.done / self.seconds, 3) if self.seconds > 0 else 0.0,
               "read_ms": round(self.read_ms, 1), "compute_ms": round(self.compute_ms, 1),
               "write_ms": round(self.write_ms, 1)}
        if self.startup_s is not None:
            out["startup_s"] = round(self.startup_s, 3)
        if self.workers:
            out["workers"] = self.workers
        if self.io_processes is not None:
            out["io_processes"] = self.io_processes
        if self.metric_counts is not None:
            out["evaluated"] = self.evaluated
            out["metrics"] = metrics.rounded(metrics.summarize(self.metric_counts))
        return out


# ----------------------------------------------------------------------------- pairing

class Pattern:
    """A glob relative to a folder, whose wildcards (or `{name}`) give each file's key."""

    def __init__(self, pattern: str | None, suffixes=IMAGE_SUFFIXES, what: str = "--left-glob"):
        self.text = pattern
        self.suffixes = suffixes
        if pattern is None:
            return
        p = pattern.replace("\\", "/").strip("/")
        if not p or p.startswith("../") or "/../" in p:
            raise StereoError(f"{what} {pattern!r}: give a pattern inside the folder, e.g. '*_10.png'")
        self.has_name = "{name}" in p
        self.glob = p.replace("{name}", "*")
        self.regex = re.compile(_glob_regex(p))
        last = p.rsplit("/", 1)[-1]
        self.fixed_name = not self.has_name and not any(c in last for c in "*?[")
        if self.fixed_name and "/" not in p:
            raise StereoError(f"{what} {pattern!r} has no wildcard, so it names one file; "
                              f"use e.g. '*.png' or '*/{p}'")

    def files(self, folder: Path) -> dict[str, tuple[Path, str]]:
        """{key: (path, output name without extension)} of the files in `folder`."""
        if self.text is None:
            out = {}
            for f in sorted(folder.iterdir()):
                if f.is_file() and f.suffix.lower() in self.suffixes:
                    out.setdefault(f.stem, (f, f.stem))
            return out
        out = {}
        for f in sorted(folder.glob(self.glob)):
            if not f.is_file():
                continue
            rel = f.relative_to(folder).as_posix()
            m = self.regex.fullmatch(rel)
            if m is None:
                continue
            if self.has_name:
                key = name = m.group("name")
            else:
                key = "\x00".join(g or "" for g in m.groups())
                name = os.path.dirname(rel) if self.fixed_name else os.path.splitext(rel)[0]
            out.setdefault(key, (f, name))
        return out


def _glob_regex(p: str) -> str:
    """Glob (with `**`, `*`, `?`, `[...]`, `{name}`) -> regex with one group per wildcard."""
    out, i = [], 0
    while i < len(p):
        if p.startswith("{name}", i):
            out.append("(?P<name>[^/]+)")
            i += 6
        elif p.startswith("**/", i):
            out.append("((?:[^/]+/)*)")
            i += 3
        elif p.startswith("**", i):
            out.append("(.*)")
            i += 2
        elif p[i] == "*":
            out.append("([^/]*)")
            i += 1
        elif p[i] == "?":
            out.append("([^/])")
            i += 1
        elif p[i] == "[" and "]" in p[i + 1:]:
            j = p.index("]", i + 2) if p[i + 1] == "]" else p.index("]", i + 1)
            body = p[i + 1:j]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append(f"([{body}])")
            i = j + 1
        else:
            out.append(re.escape(p[i]))
            i += 1
    return "".join(out)


def find_pairs(left_dir, right_dir, out_dir, ext: str, left_glob=None, right_glob=None,
               sbs: bool = False) -> list[Pair]:
    """Pairs of LEFT_DIR x RIGHT_DIR by key; left files without a partner become failed pairs."""
    left_dir = _folder(left_dir, "LEFT_DIR")
    lp = Pattern(left_glob, what="--left-glob")
    lefts = lp.files(left_dir)
    if not lefts:
        what = f"matches {left_glob!r}" if left_glob else "is an image"
        raise StereoError(f"no file in {left_dir} {what}; check the folder or --left-glob")
    if sbs:
        return [Pair(str(f), None, io.join(out_dir, name + ext), key) for key, (f, name) in lefts.items()]
    right_dir = _folder(right_dir, "RIGHT_DIR")
    rights = Pattern(right_glob if right_glob is not None else left_glob, what="--right-glob").files(right_dir)
    if not rights:
        raise StereoError(f"no file in {right_dir} matches {right_glob or left_glob or 'an image name'!r}; "
                          f"check the folder or --right-glob")
    pairs = []
    for key, (f, name) in lefts.items():
        out = io.join(out_dir, name + ext)
        if key in rights:
            pairs.append(Pair(str(f), str(rights[key][0]), out, key))
        else:
            pairs.append(Pair(str(f), None, out, key, error=f"no right image in {right_dir} pairs with it"))
    if not any(p.error is None for p in pairs):
        raise StereoError(f"no file of {left_dir} has a partner in {right_dir}; check --left-glob/--right-glob")
    return pairs


def iter_pairs_lines(lines, out_dir, ext: str, sbs: bool = False, source: str = "--pairs"):
    """Pairs from lines `left<TAB>right[<TAB>output]` (`frame[<TAB>output]` with --sbs), one
    as soon as its line is read (standard input streams); # comments and blank lines skipped."""
    need = 1 if sbs else 2
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.rstrip("\r\n").split("\t")
        if len(fields) < need or len(fields) > need + 1 or not all(fields):
            want = "frame[<TAB>output]" if sbs else "left<TAB>right[<TAB>output]"
            yield Pair(fields[0], None, io.join(out_dir, f"line{n}{ext}"), f"line{n}",
                       error=f"{source} line {n}: expected {want}, got {len(fields)} field(s)")
            continue
        left = fields[0]
        right = None if sbs else fields[1]
        if len(fields) > need:
            out = fields[need]
            if os.path.splitext(out)[1].lower() not in io.DISPARITY_FORMATS:
                out += ext
            if not (io.is_url(out) or os.path.isabs(out)):
                out = io.join(out_dir, out)
        else:
            out = io.join(out_dir, PurePosixPath(left).stem + ext)
        yield Pair(left, right, out, PurePosixPath(out).stem)


def read_pairs_file(text: str, out_dir, ext: str, sbs: bool = False, source: str = "--pairs") -> list[Pair]:
    """All the pairs of a --pairs file's text (see iter_pairs_lines); none is an error."""
    pairs = list(iter_pairs_lines(text.splitlines(), out_dir, ext, sbs, source))
    if not pairs:
        raise StereoError(f"{source} holds no pairs; give lines 'left<TAB>right[<TAB>output]'")
    return pairs


def attach_ground_truth(pairs, gt_dir, gt_glob=None):
    """Give each pair the ground-truth file with the same key (by default: output name).
    `pairs` may be a stream: the pairs are returned as they come, each with its `gt`."""
    gts = Pattern(gt_glob, suffixes=set(io.DISPARITY_FORMATS), what="--gt-glob").files(_folder(gt_dir, "--gt-dir"))
    by_name = {Path(name).name: f for f, name in gts.values()}

    def attach(p):
        hit = gts.get(p.key)
        p.gt = hit[0] if hit else by_name.get(PurePosixPath(p.output).stem)
        return p
    return [attach(p) for p in pairs] if isinstance(pairs, list) else map(attach, pairs)


def checked_stream(pairs):
    """check_outputs for a stream of pairs: a pair that would write another's output, or
    over its own inputs, fails (as one bad pair) instead of stopping the others."""
    seen = {}
    for p in pairs:
        if p.error is None:
            out = _real(p.output)
            if out in seen:
                p.error = f"{seen[out]} already writes {p.output}; give each pair its own output"
            elif out in {_real(x) for x in (p.left, p.right) if x and x != "-"}:
                p.error = f"the output {p.output} would overwrite an input image"
            else:
                seen[out] = p.left
        yield p


def _real(x):
    return x if io.is_url(x) else os.path.realpath(x)


def check_outputs(pairs: list[Pair]) -> None:
    """Before any work: no two pairs share an output, no output overwrites an input."""
    seen = {}
    inputs = {_real(x) for p in pairs for x in (p.left, p.right) if x and x != "-"}
    for p in pairs:
        if p.error:
            continue
        real_out = _real(p.output)
        if real_out in seen:
            raise StereoError(f"{p.left} and {seen[real_out]} would both write {p.output}; "
                              f"give outputs in --pairs or a pattern with {{name}}")
        if real_out in inputs:
            raise StereoError(f"the output {p.output} would overwrite an input image; choose another -o folder "
                              f"or --format")
        seen[real_out] = p.left


def _folder(path, what) -> Path:
    p = Path(path)
    if not p.is_dir():
        raise StereoError(f"{what} {p} is not a folder" if p.exists() else f"{what} {p}: no such folder")
    return p


def collect_pairs(folders, out_dir, ext: str, *, pairs_file=None, sbs=False, left_glob=None, right_glob=None,
                  gt_dir=None, gt_glob=None, stream=False, submission=None, method="stereocli", extras=None):
    """The pairs of a batch, from folders (LEFT_DIR RIGHT_DIR, or one folder of
    side-by-side frames) or a --pairs file ('-': standard input, read lazily with
    `stream`), with their ground truth; checked (outputs distinct, no input
    overwritten) and the output folder created. A stream is checked pair by pair."""
    if stream:
        pairs = checked_stream(iter_pairs_lines(sys.stdin, out_dir, ext, sbs, "--pairs (stdin)"))
    elif pairs_file:
        if pairs_file == "-":
            text, source = sys.stdin.read(), "--pairs (stdin)"
        else:
            try:
                text, source = Path(pairs_file).read_text(), f"--pairs {pairs_file}"
            except OSError as e:
                raise StereoError(f"cannot read --pairs {pairs_file}: {e.strerror}") from None
        pairs = read_pairs_file(text, out_dir, ext, sbs, source)
    else:
        pairs = find_pairs(folders[0], None if sbs else folders[1], out_dir, ext, left_glob, right_glob, sbs)
    if gt_dir:
        pairs = attach_ground_truth(pairs, gt_dir, gt_glob)
    if submission:
        pairs = as_submission(pairs, submission, out_dir, method)
        pairs = pairs if stream else list(pairs)
    if extras:
        pairs = with_extras(pairs, **extras)
        pairs = pairs if stream else list(pairs)
    if not stream:
        check_outputs(pairs)
    for folder in (out_dir, *(extras.get(k) for k in EXTRA_DIRS if extras)):
        if folder and not io.is_url(folder):
            io.make_folder(folder)
    return pairs


# ----------------------------------------------------------------------------- running

EXTRA_DIRS = ("preview_dir", "depth_dir", "ply_dir", "confidence_dir", "error_map_dir")


def with_extras(pairs, *, preview_dir=None, depth_dir=None, ply_dir=None, confidence_dir=None, error_map_dir=None,
                camera=None, disparity_range=(0, 0)):
    """Give each pair the extra files batch writes beside its map (NAME.png previews,
    NAME.pfm depth, NAME.ply clouds, NAME.pfm confidence maps, NAME.png error pictures
    of pairs with ground truth, in the given folders); `camera`: (focal, baseline, doffs,
    calib) where calib may be a file name looked up in each left image's folder."""
    for p in pairs:
        name = PurePosixPath(p.output).stem
        p.extras = {"range": disparity_range, "camera": camera,
                    "preview": io.join(preview_dir, name + ".png") if preview_dir else None,
                    "depth": io.join(depth_dir, name + ".pfm") if depth_dir else None,
                    "ply": io.join(ply_dir, name + ".ply") if ply_dir else None,
                    "confidence": io.join(confidence_dir, name + ".pfm") if confidence_dir else None,
                    "error_map": io.join(error_map_dir, name + ".png") if error_map_dir else None}
        yield p


def ok_event(pair: Pair, result, read_ms: float) -> dict:
    """The event of a matched pair (its write_ms is added once written)."""
    return {**_event(pair, "ok"), "read_ms": round(read_ms, 3), **_result_fields(result)}


def _result_fields(result) -> dict:
    out = {"width": int(result.disparity.shape[1]), "height": int(result.disparity.shape[0]),
           "device": result.device, "strips": result.strips,
           "timings_ms": {k: round(v, 3) for k, v in result.timings.items()},
           "compute_ms": round(result.total_ms, 3)}
    if result.notes:
        out["notes"] = result.notes
    return out


def default_threads() -> int:
    """Reader (and writer) threads of a batch in one process: one per core, 4 to 16.
    PNG decoding and encoding take about 23 ms of CPU per pair of the shared scenes on
    the H100 machine's 16-core host, so a GPU batch is bound by them: there, with
    benchmarks/batch.py --device cuda --pairs 800, 4 threads gave 335-341 pairs/s, 8
    420-426 and 16 439-452 (alternated, one machine)."""
    return max(4, min(16, os.cpu_count() or 4))


# --io-processes auto: worker processes for a GPU batch of AUTO_IO_MIN_PAIRS pairs or more
# (or a stream) on Linux with AUTO_IO_MIN_CORES cores or more: one per core but an eighth
# of them (for the batch's own process: the matching thread and the pool's threads), at
# most AUTO_IO_MAX.
AUTO_IO_MIN_CORES = 8
AUTO_IO_MIN_PAIRS = 64
AUTO_IO_MAX = 32


def auto_io_processes(gpu: bool, pairs: int | None, cores: int | None = None) -> int:
    """How many worker processes `stereo batch --io-processes auto` runs the file work
    in (0: reader and writer threads). `gpu`: the batch matches on a GPU (on the CPU the
    matching, not the codec, is the bound, and processes would take its cores);
    `pairs`: how many (None: a stream); `cores`: those this process may run on.

    The worker processes decode, make grey and encode under interpreters of their own,
    where threads share the matching thread's. H200 machine, 16 cores, `stereo batch
    --device cuda -n 64` over 400 / 1600 / 4000 pairs of the shared scenes, the batch's
    seconds in two rounds: 16 threads 0.9 / 3.1-3.5 / 7.6-8.2, 15 processes 0.7-0.9 /
    2.3-2.5 / 5.6-5.9 (their pool started before the backend, codecs.Workers). On 32
    cores (`benchmarks/batch.py --device cuda --pairs 4000`, pairs/s): 16 threads 550,
    31 processes 847-933, 28 processes 964-977, and with WORKERS_SWITCH_S 28 processes
    1105-1168, 26 1156-1214, 30 903-992."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if not gpu or not sys.platform.startswith("linux") or cores < AUTO_IO_MIN_CORES:
        return 0
    if pairs is not None and pairs < AUTO_IO_MIN_PAIRS:
        return 0
    return min(AUTO_IO_MAX, cores - cores // 8)


# OpenCV's own thread pool while a batch runs its reader and writer threads: those
# threads already decode and encode side by side, and OpenCV's pool on top of them
# (its colour conversions run parallel loops) made the cores wait on each other. H100
# machine's 16-core host, scratch codec loop (two PNG reads and a map's encode a pair,
# 4000 pairs in 16 threads): 498 pairs/s with OpenCV's default, 694 with one thread.
# None leaves OpenCV's setting alone.
CODEC_CV2_THREADS: int | None = 1


class _Held:
    """A process-wide setting that batches running at once hold at a value (a Dask
    worker runs several chunks, batch.run calls, at once): the value from before the
    first hold comes back when the last is released."""

    def __init__(self, get, put):
        self._get, self._put = get, put
        self._lock = threading.Lock()
        self._holds, self._before = 0, None

    def hold(self, value) -> None:
        with self._lock:
            if self._holds == 0:
                self._before = self._get()
                self._put(value)
            self._holds += 1

    def release(self) -> None:
        with self._lock:
            self._holds -= 1
            if self._holds == 0:
                self._put(self._before)


_cv2_threads = _Held(cv2.getNumThreads, cv2.setNumThreads)  # at CODEC_CV2_THREADS: batches with codec threads

# The interpreter's switch interval while a batch with worker processes runs: its
# matching thread shares this process's interpreter with the pool's threads, which move
# each read and write to and from the workers, and each waits for the interpreter at
# every hand-over. H200 machine with 32 cores, `benchmarks/batch.py --device cuda --pairs
# 4000` (pairs/s, two rounds): 31 processes at Python's 5 ms 933 / 904, 0.5 ms 955 / 978,
# 0.2 ms (28 processes) 918 / 972, 20 ms 891 / 878; 28 processes at 5 ms 964 / 977, at
# 0.5 ms 1168 / 1105; 26 processes at 0.5 ms 1156 / 1214. STEREOCLI_BATCH_SWITCH_S sets it.
WORKERS_SWITCH_S = float(os.environ.get("STEREOCLI_BATCH_SWITCH_S", "0.0005"))
_switch_interval = _Held(sys.getswitchinterval, sys.setswitchinterval)


def run(pairs, params, backend, ext: str, *, threads: int = 4, processes: int = 0, skip_existing: bool = False,
        on_event=None, max_disparity=None, summary: Summary | None = None, compute=None,
        png: str = PNG_DEFAULT) -> Summary:
    """Match every pair; one bad pair is reported (event status "failed") and skipped.
    PNG maps are written as `png` says (io.PNG_COMPRESSIONS; PNG_DEFAULT).
    The pairs are read and written by `threads` reader and writer threads, or with
    `processes` > 0 by that many worker processes (codecs.Workers, kept for later runs).
    `compute(fn, *args, **kw)` runs each match (default: in this thread); a Dask worker
    running chunks side by side hands every match to its one device thread.
    `pairs` may be a list or a stream (e.g. lines of standard input): each pair starts
    as soon as it arrives, and its event is passed on as soon as its map is written,
    also while the next pair has not arrived yet.
    KeyboardInterrupt stops after the writes in flight finish (outputs are written whole
    or not at all) and is re-raised, with `summary.interrupted` set on `summary`."""
    summary = summary if summary is not None else Summary()
    report = summary.reporter(on_event)
    start = time.perf_counter()
    workers = codecs.Workers.get(processes) if processes > 0 else None
    if compute is None:  # (a Dask worker's chunks: its summary is the cluster's)
        summary.io_processes = processes
    if workers is not None:  # (the GPU then uploads a pair from its read slot and downloads its map into a write slot)
        workers.reads.set_pin(backend.pin_host)
        workers.writes.set_pin(backend.pin_host)
    lookahead = max(2, 2 * threads) if workers is None else processes + 2
    readers = writers = None
    if workers is None:
        readers = ThreadPoolExecutor(threads, thread_name_prefix="stereo-read")
        writers = ThreadPoolExecutor(threads, thread_name_prefix="stereo-write")
    reads: queue.Queue = queue.Queue(maxsize=lookahead)  # (pair, read future or None), in order; END last
    writes: deque = deque()  # (pair, future, event)
    stop = threading.Event()

    def feed():
        """Thread: take pairs from the (possibly blocking) source, start their reads."""
        try:
            for p in pairs:
                if stop.is_set():
                    break
                if p.error is None and skip_existing and io.exists(p.output):
                    reads.put((p, "skipped"))
                elif p.error:
                    reads.put((p, None))
                else:
                    reads.put((p, readers.submit(load_prepared, p) if workers is None else workers.read(p, stop)))
        except codecs.Stopped:
            pass
        except BaseException as e:  # a broken source ends the batch with its error
            reads.put((None, e))
        reads.put(_END)

    def finish(block: bool):
        while writes and (block or writes[0][1].done() or len(writes) > lookahead):
            p, fut, ev = writes.popleft()
            try:
                write_ms, counts = fut.result()
            except Exception as e:  # one bad pair must not stop the batch
                report(failed_event(p, error_text(e), ev))
                continue
            ev["write_ms"] = round(write_ms, 3)
            report(ev, counts)

    def next_read():
        """The next (pair, read) in order; meanwhile report the writes that finish."""
        while True:
            try:
                return reads.get(timeout=0.02 if writes else None)
            except queue.Empty:
                finish(block=False)

    feeder = threading.Thread(target=feed, name="stereo-feed", daemon=True)
    held = None  # (held before the first read)
    if workers is not None:
        held, value = _switch_interval, WORKERS_SWITCH_S
    elif threads > 1 and CODEC_CV2_THREADS is not None:
        held, value = _cv2_threads, CODEC_CV2_THREADS
    if held is not None:
        held.hold(value)
    feeder.start()
    try:
        while True:
            item = next_read()
            if item is _END:
                break
            p, fut = item
            if p is None:
                raise fut
            if fut == "skipped":
                report(_event(p, "skipped"))
                continue
            if p.error:
                report(failed_event(p, p.error))
                continue
            done_with_images = getattr(fut, "release", None)  # (a worker's slot: free it for the next pair)
            out = None  # (with workers: a write slot that the map goes straight into)
            try:
                inp, read_ms = fut.result()  # (decoded and made grey by the reader)
                out = workers.map_buffer(inp.shape) if workers is not None else None
                result = (compute or _here)(pipeline.run_prepared, inp, params, backend,
                                            confidence=p.wants_confidence, out=None if out is None else out[1])
                ev = ok_event(p, result, read_ms)
                slot, out = (None if out is None else out[0]), None  # (the write's from here: it gives it back if it fails)
                save = writers.submit if workers is None else _worker_write(workers, slot)
                writing = save(save_result, p, result.disparity, ext, max_disparity, result.total_ms / 1e3,
                               inp.left, result.confidence, png)
            except Exception as e:
                raise_interrupt(e)
                report(failed_event(p, error_text(e)))
                continue
            finally:
                if done_with_images is not None:
                    done_with_images()
                if out is not None:
                    workers.writes.give(out[0])
            writes.append((p, writing, ev))
            finish(block=False)
        finish(block=True)
    except KeyboardInterrupt:
        summary.interrupted = True
        stop.set()
        while True:  # cancel the reads queued so far (and let a blocked feeder go on to see `stop`)
            try:
                item = reads.get_nowait()
            except queue.Empty:
                break
            if item is not _END and hasattr(item[1], "cancel"):
                item[1].cancel()
        finish(block=True)  # let the writes in flight complete: no half-written outputs
        raise
    finally:
        if workers is None:
            readers.shutdown(wait=False, cancel_futures=True)
            writers.shutdown(wait=True)
        if held is not None:
            held.release()
        summary.seconds = time.perf_counter() - start
    return summary


_END = object()


def _worker_write(workers, slot=None):
    return lambda _fn, *args: workers.write(*args, slot=slot)


def _here(fn, *args, **kw):
    return fn(*args, **kw)


def error_text(e: BaseException) -> str:
    """The line reported for a failed pair: a StereoError's message, else what broke."""
    return str(e) if isinstance(e, StereoError) else f"internal error: {type(e).__name__}: {e}"


def failed_event(p: Pair, error: str, ev: dict | None = None) -> dict:
    """The event of a failed pair (`ev`: what was known of it so far)."""
    return {**(ev or _event(p, "failed")), "status": "failed", "error": error}


def _event(p: Pair, status: str) -> dict:
    ev = {"left": p.left, "right": p.right, "output": str(p.output), "status": status}
    if p.gt is not None:
        ev["gt"] = str(p.gt)
    return ev
