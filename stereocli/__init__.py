"""stereocli: classical stereo disparity (census/SAD/ZNCC/MI costs, SGM) on CPU and CUDA.

    import stereocli
    disp, timings = stereocli.match(left, right, num_disparities=64)

`disp` is float32 with NaN where no disparity was found; pixel (x, y) of the left
image matches (x - disp, y) of the right image.
"""
from __future__ import annotations

__version__ = "0.1.0"

from . import cache  # noqa: F401  (first: points Numba's kernel cache at the user's folder)
from .errors import StereoError


def match(left, right, *, preset: str = "default", device: str = "cpu", config_file=None, **options):
    """Disparity of a rectified pair.

    left, right: image arrays (grey or BGR, uint8/uint16/float) or paths to image files.
    options: any field of `stereocli.config.Params` (num_disparities, min_disparity,
    cost, window, paths, p1, p2, uniqueness, subpixel, lr_check, fill, median, ...),
    applied over the preset.
    Returns (disparity float32 HxW with NaN = invalid, timings {stage: ms}).
    """
    from . import config, io, pipeline
    from .backends import get_backend

    if not hasattr(left, "shape"):
        left = io.read_image(left)
    if not hasattr(right, "shape"):
        right = io.read_image(right)
    params = config.load(preset, config_file, options)
    result = pipeline.run(left, right, params, get_backend(device))
    return result.disparity, result.timings


__all__ = ["match", "StereoError", "__version__"]
