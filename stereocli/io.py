"""Reading images and reading/writing disparity maps.

In memory a disparity map is float32 with NaN where invalid. On disk:
  .pfm        float32, invalid = inf (Middlebury)
  .png        uint16, value = round(d * 256), 0 = invalid (KITTI)
  .npy        float32, invalid = NaN
  .tif/.tiff  float32, invalid = NaN
Every writer writes to a temporary file in the target folder and renames it, so a
reader never sees half a file and a failed write leaves nothing behind.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from .errors import StereoError

# OpenCV's own warnings (e.g. "[ WARN:0@0.2] global grfmt_png.cpp ...") would come
# before our one-line errors; what went wrong is said by StereoError instead.
cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_ERROR)

DISPARITY_FORMATS = (".pfm", ".png", ".npy", ".tif", ".tiff")
PNG_MAX = 65535 / 256.0  # largest disparity a KITTI PNG holds
# How a 16-bit PNG map is written: "small" deflated (OpenCV's default), "fast" stored
# (zlib level 0, no row filters: the same PNG any reader decodes, 1.5x the bytes). A
# 450x375 map of the shared scenes: 3.15 / 0.29 ms, 222 / 338 KB (2-core machine), 4.33
# / 0.39 ms on the H200 machine's host, where the encode of a GPU batch's maps is a
# third of its codec's time (docs/speed.md, forty-sixth session).
PNG_COMPRESSIONS = ("fast", "small")
_PNG_PARAMS = {"small": [],
               "fast": [cv2.IMWRITE_PNG_COMPRESSION, 0]
               + ([cv2.IMWRITE_PNG_FILTER, cv2.IMWRITE_PNG_FILTER_NONE] if hasattr(cv2, "IMWRITE_PNG_FILTER") else [])}


def to_grey(img: np.ndarray, keep_u8: bool = False) -> np.ndarray:
    """Colour (BGR/BGRA) or grey, 8 or 16 bit or float -> float32 grey scaled to 0..255
    (with keep_u8, an 8-bit image stays uint8: the same values, a quarter of the bytes).

    Float images in 0..1 are scaled to 0..255, others kept as they are. Non-finite
    pixels (NaN, +-inf) become 0 here; `nonfinite_mask` finds them so that the
    pipeline can mark their disparities invalid.
    """
    if img.ndim == 3 and img.shape[2] == 1:
        img = img[:, :, 0]
    if img.ndim == 3 and img.shape[2] not in (3, 4):
        raise StereoError(f"unsupported image with {img.shape[2]} channels; give a grey, BGR or BGRA image")
    if img.ndim not in (2, 3):
        raise StereoError(f"unsupported image shape {img.shape}; give a grey or colour image")
    if img.dtype not in (np.uint8, np.uint16, np.float32, np.float64):
        raise StereoError(f"unsupported pixel type {img.dtype}; give an 8- or 16-bit or a float image")
    if img.dtype == np.float64 or (img.dtype == np.float32 and img.ndim == 3):
        img = np.nan_to_num(img.astype(np.float32), nan=0.0, posinf=0.0, neginf=0.0)
    if img.ndim == 3:
        code = cv2.COLOR_BGRA2GRAY if img.shape[2] == 4 else cv2.COLOR_BGR2GRAY
        img = cv2.cvtColor(img, code)
    if img.dtype == np.uint8:
        return img if keep_u8 else img.astype(np.float32)
    if img.dtype == np.uint16:
        return img.astype(np.float32) * np.float32(255.0 / 65535.0)
    return _unit_to_255(np.where(np.isfinite(img), img, np.float32(0)).astype(np.float32))


def _unit_to_255(img: np.ndarray) -> np.ndarray:
    """A finite float image in 0..1 scaled to 0..255; any other kept as it is."""
    hi = float(img.max()) if img.size else 1.0
    return img * np.float32(255.0) if hi <= 1.0 else img


def to_guide(img: np.ndarray) -> np.ndarray:
    """The image as H x (W * C) uint8 (C = 3 for colour, BGR; 1 for grey), scaled like
    to_grey: the guide of the weighted median, which weighs colour likeness."""
    return _guide_bytes(img).reshape(img.shape[0], -1)


def _guide_bytes(img: np.ndarray) -> np.ndarray:
    if img.ndim == 2:
        img = img[:, :, None]
    img = img[:, :, :3]
    if img.dtype == np.uint8:
        return np.ascontiguousarray(img)
    if img.dtype == np.uint16:
        return (img >> 8).astype(np.uint8)
    img = _unit_to_255(np.nan_to_num(img.astype(np.float32), nan=0.0, posinf=0.0, neginf=0.0))
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def nonfinite_mask(img: np.ndarray) -> np.ndarray | None:
    """HxW bool of the pixels with a NaN or infinite channel (float images), else None."""
    if img.dtype.kind != "f":
        return None
    bad = ~np.isfinite(img)
    if bad.ndim == 3:
        bad = bad.any(axis=2)
    return bad if bad.any() else None


@dataclass
class PairInput:
    """A pair as the matcher takes it (`prepare_pair`): the grey images (uint8 where
    both images are 8-bit, else float32 0..255), the left image as given (the weighted
    median's guide, and the colours of a point cloud) and the masks of non-finite
    pixels (float images; None where there are none)."""
    left: np.ndarray
    grey_left: np.ndarray
    grey_right: np.ndarray
    bad_left: np.ndarray | None = None
    bad_right: np.ndarray | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.grey_left.shape


def prepare_pair(left: np.ndarray, right: np.ndarray) -> PairInput:
    """The per-pixel host work before a match: grey conversion and non-finite masks.
    A batch runs it in its reader threads or worker processes, so that the matching
    thread only uploads and matches (pipeline.run_prepared)."""
    bytes_in = left.dtype == np.uint8 and right.dtype == np.uint8  # upload bytes, make floats on the device
    return PairInput(left, to_grey(left, keep_u8=bytes_in), to_grey(right, keep_u8=bytes_in),
                     nonfinite_mask(left), nonfinite_mask(right))


MAX_PIXELS_VAR = "OPENCV_IO_MAX_IMAGE_PIXELS"  # OpenCV's own limit, read when cv2 loads
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_truncated(data: bytes) -> bool:
    """A PNG whose chunks end before IEND (libpng would print its own error line)."""
    pos, n = 8, len(data)
    while pos + 8 <= n:
        length = int.from_bytes(data[pos:pos + 4], "big")
        if data[pos + 4:pos + 8] == b"IEND":
            return False
        pos += 12 + length
    return True


def decode_image(data: bytes, name: str) -> np.ndarray:
    """Encoded bytes -> the image as stored, or a one-line StereoError saying why not."""
    if not data:
        raise StereoError(f"{name} is empty (0 bytes); give an image file (PNG, JPEG, TIFF, PGM/PPM, ...)")
    if data.startswith(_PNG_SIGNATURE) and _png_truncated(data):
        raise StereoError(f"{name} is a truncated PNG (it ends before its last chunk); "
                          f"copy or write the file again")
    try:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error as e:
        if "CV_IO_MAX_IMAGE_PIXELS" in str(e):
            raise StereoError(f"{name} claims more pixels than OpenCV's limit of {_max_pixels()} (a damaged or "
                              f"hostile file?); if it is real, raise the limit with {MAX_PIXELS_VAR}=N") from None
        raise StereoError(f"cannot decode {name}: OpenCV could not read it "
                          f"({str(e).strip().splitlines()[-1][:120]})") from None
    if img is None:
        raise StereoError(f"cannot decode {name}: not an image OpenCV can read (PNG, JPEG, TIFF, PGM/PPM, ...)")
    if img.size == 0:
        raise StereoError(f"{name} holds an image with no pixels")
    return img


def _max_pixels() -> str:
    return os.environ.get(MAX_PIXELS_VAR, str(2 ** 30))


def is_url(path) -> bool:
    """An fsspec URL (s3://, gs://, http://, file://, ...) rather than a local path."""
    return "://" in str(path)


def _fs(url: str):
    try:
        import fsspec
    except ImportError:
        raise StereoError(f"{url}: reading and writing URLs needs fsspec: pip install fsspec "
                          f"(and the package of the protocol, e.g. s3fs)") from None
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as e:
        raise StereoError(f"{url}: {e}") from None


def read_bytes(path) -> bytes:
    """The bytes of a local file or an fsspec URL, with a one-line error when it cannot be read."""
    if is_url(path):
        fs, p = _fs(str(path))
        try:
            return fs.cat_file(p)
        except FileNotFoundError:
            raise StereoError(f"{path}: no such file") from None
        except Exception as e:
            raise StereoError(f"cannot read {path}: {e}") from None
    p = Path(path)
    if not p.exists():
        raise StereoError(f"{p}: no such file")
    if p.is_dir():
        raise StereoError(f"{p} is a folder; give a file")
    try:
        return p.read_bytes()
    except OSError as e:
        raise StereoError(f"cannot read {p}: {e.strerror}") from None


def exists(target) -> bool:
    if is_url(target):
        fs, p = _fs(str(target))
        return fs.exists(p)
    return Path(target).exists()


def join(folder, name: str) -> str:
    """folder/name for a local folder or a URL."""
    if is_url(folder):
        return str(folder).rstrip("/") + "/" + name
    return str(Path(folder) / name)


def write_file(target, data: bytes) -> None:
    """Write a whole file: locally through a temporary file and a rename (creating the
    folder), to a URL with one put (object stores show a file whole or not at all)."""
    if is_url(target):
        fs, p = _fs(str(target))
        try:
            parent = p.rsplit("/", 1)[0]
            if parent and parent != p:
                fs.makedirs(parent, exist_ok=True)
            fs.pipe_file(p, data)
        except Exception as e:
            raise StereoError(f"cannot write {target}: {e}") from None
        return
    path = Path(target)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)
    except OSError as e:
        raise StereoError(f"cannot write {path}: {e.strerror}") from None


def read_image(path: str | os.PathLike) -> np.ndarray:
    """Read an image file (or fsspec URL) as it is stored (grey or colour, 8/16 bit);
    "-" reads standard input."""
    if str(path) == "-":
        import sys
        data = sys.stdin.buffer.read()
        if not data:
            raise StereoError("standard input is empty; pipe an encoded image into it (e.g. PNG)")
        return decode_image(data, "standard input")
    if not is_url(path) and Path(path).is_dir():
        raise StereoError(f"{path} is a folder; give an image file")
    return decode_image(read_bytes(path), str(path))


def split_side_by_side(img: np.ndarray, name: str = "the image") -> tuple[np.ndarray, np.ndarray]:
    """One side-by-side frame (left half | right half) -> (left, right)."""
    w = img.shape[1]
    if w % 2:
        raise StereoError(f"{name} is {w} px wide, an odd width, so it is not a side-by-side pair; "
                          f"drop --sbs or give the frame at its full, even width")
    return img[:, : w // 2], img[:, w // 2:]


def check_output_path(path: str | os.PathLike, fmt: str | None = None) -> tuple[Path, str]:
    """Validate an output path before any work: folder exists, extension known (or `fmt`
    given, which then must agree with a known extension)."""
    p = Path(path)
    ext = p.suffix.lower()
    if fmt is not None:
        fmt = "." + fmt.lower().lstrip(".")
        if ext in DISPARITY_FORMATS and ext.replace("tiff", "tif") != fmt.replace("tiff", "tif"):
            raise StereoError(f"{p} ends in {ext} but --format is {fmt[1:]}; make them agree")
        ext = fmt
    if ext not in DISPARITY_FORMATS:
        raise StereoError(f"{p}: cannot write disparity as {ext or 'a file without extension'!r}; "
                          f"use one of {', '.join(DISPARITY_FORMATS)}")
    check_folder(p)
    return p, ext


def check_float_map_path(path: str | os.PathLike, what: str) -> Path:
    """An output path for a float map (depth, confidence): like check_output_path, but
    not a 16-bit PNG, which holds disparities only."""
    p, ext = check_output_path(path)
    if ext == ".png":
        raise StereoError(f"{p}: {what} is written as float: use .pfm, .npy or .tiff")
    return p


def check_png_range(min_disparity: int, hi: int) -> None:
    """A 16-bit PNG (d * 256) holds the range min_disparity..hi, or a StereoError says what to write instead."""
    if min_disparity < 0 or hi + 0.5 > PNG_MAX:
        raise StereoError(f"a 16-bit PNG holds disparities 0..255 but the range is "
                          f"{min_disparity}..{hi}; write .pfm, .npy or .tiff instead")


def _write_pfm(f, disp: np.ndarray) -> None:
    h, w = disp.shape
    out = np.where(np.isfinite(disp), disp, np.inf).astype("<f4")
    f.write(f"Pf\n{w} {h}\n-1.0\n".encode("ascii"))
    f.write(np.ascontiguousarray(out[::-1]).tobytes())


def read_pfm(data: bytes, name: str = "PFM") -> np.ndarray:
    """Grey PFM (little or big endian) -> float32, top row first."""
    lines, pos = [], 0
    try:
        while len(lines) < 3:
            end = data.index(b"\n", pos)
            line = data[pos:end].strip()
            pos = end + 1
            if line and not line.startswith(b"#"):
                lines.append(line)
        if lines[0] != b"Pf":
            raise StereoError(f"{name}: only grey PFM (header 'Pf') is supported")
        w, h = (int(v) for v in lines[1].split())
        scale = float(lines[2])
    except (ValueError, IndexError):
        raise StereoError(f"{name} is not a PFM file (header 'Pf', width height, scale)") from None
    if w < 1 or h < 1 or len(data) - pos < 4 * w * h:
        raise StereoError(f"{name}: the PFM header says {w}x{h} but the file holds "
                          f"{max(0, len(data) - pos) // 4} values; the file is damaged or truncated")
    dtype = "<f4" if scale < 0 else ">f4"
    arr = np.frombuffer(data, dtype=dtype, count=w * h, offset=pos).reshape(h, w)
    return arr[::-1].astype(np.float32)


def _read_npy(data: bytes, name: str) -> np.ndarray:
    import io as _io
    try:
        arr = np.load(_io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise StereoError(f"{name} is not a NumPy .npy file ({e})") from None
    if arr.ndim != 2 or arr.dtype.kind not in "fiu":
        raise StereoError(f"{name} holds a {arr.dtype} array of shape {arr.shape}; a disparity map is 2-D numbers")
    return arr.astype(np.float32)


def encode_disparity(disp: np.ndarray, ext: str, png: str = "small") -> bytes:
    """Encode a float32 NaN-invalid disparity map in the format of `ext` (a PNG as
    `png` says: PNG_COMPRESSIONS)."""
    import io as _io
    disp = np.asarray(disp, dtype=np.float32)
    if ext == ".pfm":
        buf = _io.BytesIO()
        _write_pfm(buf, disp)
        return buf.getvalue()
    if ext == ".npy":
        buf = _io.BytesIO()
        np.save(buf, disp)
        return buf.getvalue()
    if ext == ".png":
        # value = round(d * 256) (half to even), at least 1; 0 where d is NaN or infinite.
        # In place and without masked copies: a batch's writer threads do this for every
        # map beside the PNG encode (0.4 ms instead of 0.9 at 450x375).
        valid = np.isfinite(disp)
        every = bool(valid.all())
        v = disp * np.float32(256) if every else np.where(valid, disp * np.float32(256), np.float32(np.nan))
        if v.size and (np.fmin.reduce(v, axis=None) < 0  # (NaN, so no error, when none is valid)
                       or np.fmax.reduce(v, axis=None) > PNG_MAX * 256):
            raise StereoError("disparities outside 0..255.99 cannot be stored in a 16-bit PNG; "
                              "write .pfm, .npy or .tiff instead")
        np.rint(v, out=v)
        np.clip(v, 1, 65535, out=v)
        if not every:
            np.copyto(v, 0, where=~valid)
        v = v.astype(np.uint16)
        ok, enc = cv2.imencode(".png", v, _PNG_PARAMS[png])
    elif ext in (".tif", ".tiff"):
        ok, enc = cv2.imencode(".tiff", disp)
    else:
        raise StereoError(f"cannot write disparity as {ext!r}; use one of {', '.join(DISPARITY_FORMATS)}")
    if not ok:
        raise StereoError(f"OpenCV could not encode the disparity as {ext}")
    return enc.tobytes()


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write bytes to a temporary file beside `path`, then rename it into place."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".part", dir=p.parent if str(p.parent) else ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def remove_partial_writes(paths) -> None:
    """Delete the temporary files atomic_write leaves when its process is killed while
    writing (`.NAME.*.part` beside each local path in `paths`)."""
    by_dir: dict = {}
    for path in paths:
        if not is_url(path):
            by_dir.setdefault(Path(path).parent, set()).add(Path(path).name)
    for folder, names in by_dir.items():
        try:
            for f in folder.glob(".*.part"):
                if f.name[1:].rsplit(".", 2)[0] in names:  # "." + NAME + "." + random + ".part"
                    f.unlink(missing_ok=True)
        except OSError:
            pass


def write_disparity(path: str | os.PathLike, disp: np.ndarray, ext: str | None = None, png: str = "small") -> None:
    """Write a map atomically; the format is `ext` (".pfm", ...) or the path's extension
    (a PNG as `png` says: PNG_COMPRESSIONS)."""
    p, ext = check_output_path(path, ext)
    write_file(p, encode_disparity(disp, ext, png))


def read_disparity(path: str | os.PathLike) -> np.ndarray:
    """Read any format write_disparity writes (and Middlebury/KITTI ground truth) -> float32, NaN invalid."""
    p = path if is_url(path) else Path(path)
    ext = os.path.splitext(str(path))[1].lower()
    data = read_bytes(path)
    if ext == ".pfm":
        d = read_pfm(data, str(p))
        return np.where(np.isfinite(d), d, np.nan).astype(np.float32)
    if ext == ".npy":
        return _read_npy(data, str(p))
    img = decode_image(data, str(p))
    if img.ndim != 2:
        raise StereoError(f"{p} has {img.shape[2]} channels; a disparity map has one")
    if ext == ".png":
        if img.dtype != np.uint16:
            raise StereoError(f"{p}: a disparity PNG must be 16-bit (value = d*256, 0 = invalid)")
        return np.where(img > 0, img.astype(np.float32) / 256.0, np.nan).astype(np.float32)
    return img.astype(np.float32)


def colorize(disp: np.ndarray, min_disparity: float | None = None, max_disparity: float | None = None) -> np.ndarray:
    """Colour-mapped BGR preview; invalid pixels are black."""
    valid = np.isfinite(disp)
    lo = min_disparity if min_disparity is not None else (float(disp[valid].min()) if valid.any() else 0.0)
    hi = max_disparity if max_disparity is not None else (float(disp[valid].max()) if valid.any() else 1.0)
    # whole-array arithmetic, no boolean indexing: a 1280x720 map in about 2 ms (video frames)
    if hi > lo:
        f = np.subtract(disp, np.float32(lo), dtype=np.float32)
        f *= np.float32(255.0 / (hi - lo))
        np.clip(f, 0, 255, out=f)
        with np.errstate(invalid="ignore"):
            scaled = f.astype(np.uint8)  # NaN and inf are masked below
    else:
        scaled = np.zeros(disp.shape, np.uint8)
    out = cv2.applyColorMap(scaled, cv2.COLORMAP_TURBO)
    return cv2.bitwise_and(out, out, mask=valid.view(np.uint8))  # black where invalid


def make_folder(folder) -> None:
    """Create an output folder (and its parents), or a StereoError saying why not."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StereoError(f"cannot create the output folder {folder}: {e.strerror}") from None


def check_folder(p: Path) -> None:
    """An output's folder must exist before any work."""
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise StereoError(f"{p}: folder {folder} does not exist; create it first")


def check_preview_path(path: str | os.PathLike) -> Path:
    p = Path(path)
    if p.suffix.lower() not in (".png", ".jpg", ".jpeg"):
        raise StereoError(f"{p}: a picture must be .png or .jpg")
    check_folder(p)
    return p


def check_ply_path(path: str | os.PathLike) -> Path:
    p = Path(path)
    if p.suffix.lower() != ".ply":
        raise StereoError(f"{p}: the file name must end in .ply")
    check_folder(p)
    return p


def write_preview(path: str | os.PathLike, disp: np.ndarray, lo=None, hi=None) -> None:
    write_image(path, colorize(disp, lo, hi))


IMAGE_FORMATS = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".pgm", ".ppm")


def check_image_path(path: str | os.PathLike) -> Path:
    """An image output (any format OpenCV writes losslessly or as JPEG) whose folder exists."""
    p = Path(path)
    if p.suffix.lower() not in IMAGE_FORMATS:
        raise StereoError(f"{p}: cannot write an image as {p.suffix or 'a file without extension'!r}; "
                          f"use one of {', '.join(IMAGE_FORMATS)}")
    check_folder(p)
    return p


def write_image(path: str | os.PathLike, img: np.ndarray) -> None:
    """An image (BGR or grey, as OpenCV writes it) written whole or not at all."""
    p = check_image_path(path)
    ok, enc = cv2.imencode(p.suffix.lower(), img)
    if not ok:
        raise StereoError(f"OpenCV could not encode {p}")
    write_file(p, enc.tobytes())
