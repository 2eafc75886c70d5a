"""Stereo video: decode frames, match them, encode a colour disparity video, overlapped.

    source = open_source(sbs="in.mp4")                      # or left=..., right=...; "0" = camera 0
    stats = run(source, params, backend, VideoOutputs.plan("out.mp4", maps_dir=None, ...))

A reader thread decodes the next frames while the calling thread matches one (on the
CPU or GPU), a third thread colours the maps before it (and writes them to a folder
if asked) and a fourth encodes the coloured frames, so the rate is that of the
slowest of the four, not their sum. The colours span the disparity
range of `params` (the same on every frame: a colour means one disparity throughout).

The video is written to a hidden file beside OUTPUT and renamed when complete, so an
error or Ctrl-C never leaves a half-written video under the name asked for; from a
camera, Ctrl-C is how a recording ends, and what was recorded is kept.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

from . import io, pipeline
from .errors import StereoError, raise_interrupt

# FFmpeg's own log lines (e.g. "moov atom not found") would come before our one-line error;
# read when OpenCV first opens a video, so set before any capture
os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")

# container -> codec that the OpenCV wheels' FFmpeg writes everywhere (no hardware encoder needed)
CODECS = {".mp4": "mp4v", ".m4v": "mp4v", ".mkv": "mp4v", ".mov": "mp4v", ".avi": "MJPG"}
CAMERA_FPS = 30.0  # the output's frame rate when a camera does not say
QUEUE = 4  # frames decoded ahead, and maps waiting to be encoded


class _Capture:
    """One cv2.VideoCapture of a file or a camera ('0', '1', ...)."""

    def __init__(self, spec: str):
        self.spec = spec
        self.camera = spec.isdigit()
        if not self.camera and not os.path.exists(spec):
            raise StereoError(f"{spec}: no such file (a video file, or a camera number such as 0)")
        self.cap = cv2.VideoCapture(int(spec) if self.camera else spec)
        if not self.cap.isOpened():
            raise StereoError(f"camera {spec} could not be opened; check that it is connected and free"
                              if self.camera else f"{spec}: cannot open it as a video (is it a video file?)")

    def read(self):
        ok, frame = self.cap.read()
        return frame if ok else None

    @property
    def fps(self) -> float:
        f = self.cap.get(cv2.CAP_PROP_FPS)
        return f if f and np.isfinite(f) and 0 < f < 1000 else CAMERA_FPS

    @property
    def frames(self) -> int | None:
        n = int(self.cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
        return n if n > 0 and not self.camera else None

    def close(self):
        self.cap.release()


@dataclass
class Source:
    """A stereo stream: one side-by-side capture, or a left and a right capture."""
    captures: list
    sbs: bool
    name: str

    @property
    def camera(self) -> bool:
        return any(c.camera for c in self.captures)

    @property
    def fps(self) -> float:
        return self.captures[0].fps

    @property
    def frames(self) -> int | None:
        counts = [c.frames for c in self.captures]
        return None if None in counts else min(counts)

    def read(self):
        """The next (left, right) frames, or None at the end of the stream."""
        frames = [c.read() for c in self.captures]
        if any(f is None for f in frames):
            return None
        if self.sbs:
            return io.split_side_by_side(frames[0], self.name)
        left, right = frames
        if left.shape[:2] != right.shape[:2]:
            raise StereoError(f"the left and right videos differ in size ({left.shape[1]}x{left.shape[0]} and "
                              f"{right.shape[1]}x{right.shape[0]}); give a rectified pair of equal size")
        return left, right

    def close(self):
        for c in self.captures:
            c.close()


def open_source(sbs: str | None = None, left: str | None = None, right: str | None = None) -> Source:
    """A side-by-side video or camera (`sbs`), or two (`left` and `right`)."""
    if sbs is not None:
        return Source([_Capture(sbs)], True, f"camera {sbs}" if sbs.isdigit() else sbs)
    if left is None or right is None:
        raise StereoError("give one side-by-side INPUT, or both --left and --right")
    first = _Capture(left)
    try:
        return Source([first, _Capture(right)], False, left)
    except StereoError:
        first.close()
        raise


@dataclass
class VideoOutputs:
    """What one `stereo video` writes, checked before any frame is decoded."""
    video: Path | None
    maps_dir: Path | None
    ext: str  # format of the maps in maps_dir
    lo: float  # the colour range
    hi: float
    every: int = 1  # write every n-th map to maps_dir

    @classmethod
    def plan(cls, video, maps_dir, fmt: str, params, every: int = 1) -> "VideoOutputs":
        if video is None and maps_dir is None:
            raise StereoError("say where the result goes: -o VIDEO (.mp4/.avi/.mkv) and/or --maps-dir DIR")
        if video is not None:
            video = Path(video)
            if video.suffix.lower() not in CODECS:
                raise StereoError(f"{video}: cannot write a video as {video.suffix or 'a file without extension'!r}; "
                                  f"use one of {', '.join(CODECS)}")
            io.check_folder(video)
        ext = "." + fmt
        if maps_dir is not None:
            maps_dir = Path(maps_dir)
            if ext == ".png":
                io.check_png_range(params.min_disparity, params.max_disparity)
            io.make_folder(maps_dir)
        return cls(video, maps_dir, ext, float(params.min_disparity), float(params.max_disparity), every)


@dataclass
class Stats:
    frames: int = 0
    seconds: float = 0.0  # wall time from the first decode to the last write
    first_s: float = 0.0  # until the first frame was written (kernel loading included)
    decode_ms: float = 0.0  # summed over frames (in the reader thread)
    match_ms: float = 0.0  # summed pipeline time (in the calling thread)
    colour_ms: float = 0.0  # summed colouring and map writing (in the colouring thread)
    encode_ms: float = 0.0  # summed video encoding (in the encoding thread)
    interrupted: bool = False
    device: str = ""
    strips: int = 1
    size: tuple = (0, 0)
    notes: list = field(default_factory=list)

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0

    @property
    def steady_fps(self) -> float:
        """The rate after the first frame (once the kernels are loaded): what a live stream sees."""
        span = self.seconds - self.first_s
        return (self.frames - 1) / span if self.frames > 1 and span > 0 else self.fps

    def as_dict(self) -> dict:
        n = max(1, self.frames)
        return {"frames": self.frames, "seconds": round(self.seconds, 3), "fps": round(self.fps, 2),
                "steady_fps": round(self.steady_fps, 2), "first_frame_s": round(self.first_s, 3),
                "width": self.size[0], "height": self.size[1], "device": self.device,
                "decode_ms_per_frame": round(self.decode_ms / n, 2), "match_ms_per_frame": round(self.match_ms / n, 2),
                "colour_ms_per_frame": round(self.colour_ms / n, 2), "encode_ms_per_frame": round(self.encode_ms / n, 2),
                "interrupted": self.interrupted}


_END = object()


def _take(q: queue.Queue):
    """q.get() for the helper threads, woken whatever Ctrl-C did to the calling thread's
    put: a KeyboardInterrupt raised in the calling thread between Condition.notify's
    release of a waiter and its removal of it from the waiting list leaves the woken
    thread's lock there, and the next notify spends itself on that lock, so a get
    waiting without a timeout can sleep for ever with the end marker in the queue (a
    `stereo video` Ctrl-C test hung so in CI, its colouring thread in done.get() while
    the calling thread joined it). Polling every 0.1 s lets it find the item."""
    while True:
        try:
            return q.get(timeout=0.1)
        except queue.Empty:
            pass


def run(source: Source, params, backend, outputs: VideoOutputs, *, max_frames: int | None = None,
        on_frame=None) -> Stats:
    """Match every frame of `source` (up to max_frames) and write `outputs`; `on_frame(stats)`
    after each frame is written. KeyboardInterrupt: from a camera, ends the recording and
    keeps it; from a file, removes the partial video and is re-raised."""
    stats = Stats(device=backend.name)
    decoded: queue.Queue = queue.Queue(QUEUE)
    done: queue.Queue = queue.Queue(QUEUE)  # maps, to be coloured (and written to maps_dir)
    coloured: queue.Queue = queue.Queue(QUEUE)  # colour frames, to be encoded
    stop = threading.Event()
    failure: list = []  # the first exception of a helper thread
    tmp = writer = None
    if outputs.video is not None:
        tmp = outputs.video.with_name(f".{outputs.video.stem}.partial{outputs.video.suffix}")

    def read_frames():
        try:
            n = 0
            while not stop.is_set() and (max_frames is None or n < max_frames):
                t = time.perf_counter()
                pair = source.read()
                if pair is None:
                    break
                stats.decode_ms += (time.perf_counter() - t) * 1e3
                decoded.put(pair)
                n += 1
        except BaseException as e:  # noqa: BLE001 (handed to the calling thread)
            failure.append(e)
        decoded.put(_END)

    def colour_maps():
        """Colours each map for the video and writes the maps asked for (off the encoder's thread)."""
        try:
            i = 0
            while True:
                disp = _take(done)
                if disp is _END:
                    break
                t = time.perf_counter()
                frame = io.colorize(disp, outputs.lo, outputs.hi) if tmp is not None else None
                if outputs.maps_dir is not None and i % outputs.every == 0:
                    io.write_disparity(outputs.maps_dir / f"{i:06d}{outputs.ext}", disp, outputs.ext)
                stats.colour_ms += (time.perf_counter() - t) * 1e3
                coloured.put((frame, disp.shape))
                i += 1
        except BaseException as e:  # noqa: BLE001 (handed to the calling thread)
            failure.append(e)
            stop.set()
            while _take(done) is not _END:  # let the matcher finish putting
                pass
        coloured.put(_END)

    def encode():
        nonlocal writer
        try:
            i = 0
            while True:
                item = _take(coloured)
                if item is _END:
                    break
                frame, (h, w) = item
                t = time.perf_counter()
                if frame is not None:
                    if writer is None:
                        writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter_fourcc(*CODECS[tmp.suffix.lower()]),
                                                 source.fps, (w, h))
                        if not writer.isOpened():
                            raise StereoError(f"OpenCV could not open a {tmp.suffix} video writer for {w}x{h}; "
                                              f"try -o with .avi")
                    writer.write(frame)
                stats.encode_ms += (time.perf_counter() - t) * 1e3
                i += 1
                stats.frames = i
                stats.seconds = time.perf_counter() - start
                if i == 1:
                    stats.first_s = stats.seconds
                if on_frame:
                    on_frame(stats)
        except BaseException as e:  # noqa: BLE001
            failure.append(e)
            stop.set()
            while _take(coloured) is not _END:  # let the colouring thread finish putting
                pass

    start = time.perf_counter()
    reader = threading.Thread(target=read_frames, name="stereo-video-read", daemon=True)
    colourer = threading.Thread(target=colour_maps, name="stereo-video-colour", daemon=True)
    encoder = threading.Thread(target=encode, name="stereo-video-encode", daemon=True)
    for thread in (reader, colourer, encoder):
        thread.start()
    interrupted = None
    try:
        while not stop.is_set():
            pair = decoded.get()
            if pair is _END:
                break
            left, right = pair
            result = pipeline.run(left, right, params, backend)
            stats.match_ms += result.total_ms
            stats.strips = result.strips
            stats.size = (left.shape[1], left.shape[0])
            for note in result.notes:
                if note not in stats.notes:
                    stats.notes.append(note)
            done.put(result.disparity)
    except Exception as e:  # noqa: BLE001 (raised below, once the threads have stopped)
        try:
            raise_interrupt(e)  # Ctrl-C inside compiled code
            failure.insert(0, e)
        except KeyboardInterrupt as k:
            interrupted = k
    except KeyboardInterrupt as e:
        interrupted = e
    finally:
        stop.set()
        while reader.is_alive():  # unblock a reader waiting on a full queue
            try:
                decoded.get(timeout=0.05)
            except queue.Empty:
                pass
        done.put(_END)
        colourer.join()
        encoder.join()
        source.close()
        if writer is not None:
            writer.release()
    stats.seconds = time.perf_counter() - start
    stats.interrupted = interrupted is not None
    keep = not failure and (interrupted is None or source.camera)
    if tmp is not None:
        if keep and stats.frames and tmp.exists():
            os.replace(tmp, outputs.video)
        else:
            tmp.unlink(missing_ok=True)
    if failure:
        raise failure[0]
    if interrupted is not None and not source.camera:
        raise interrupted
    if stats.frames == 0:
        raise StereoError(f"{source.name}: no frame could be read")
    return stats
