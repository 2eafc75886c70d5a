"""`stereo match`: one pair in, one map (and its extras) out."""
from __future__ import annotations

import json

import click

from ..errors import StereoError
from .app import cli
from .common import (
    FORMATS,
    PNG_COMPRESSIONS,
    geometry_options,
    params_from,
    print_timings,
    say_if_compiling,
    stage_options,
)


@cli.command()
@click.argument("left")
@click.argument("right", required=False)
@click.option("-o", "--output", required=True,
              help="Disparity file: .pfm (float, inf invalid), .png (16-bit, d*256, 0 invalid), .npy, "
                   ".tif/.tiff; '-' = standard output (needs --format).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Output format (needed with -o -).")
@click.option("--png-compression", "png", type=click.Choice(PNG_COMPRESSIONS), default="small", show_default=True,
              help="How a 16-bit PNG map is written: small deflates it, fast stores it uncompressed (a tenth of "
                   "the encode time, about 1.5x the bytes; `stereo batch`'s default). The same values either way.")
@click.option("--sbs", is_flag=True, help="LEFT is one side-by-side frame (left half | right half); no RIGHT.")
@(lambda f: stage_options(f, auto=True))
@click.option("--preview", type=click.Path(dir_okay=False), help="Also write a colour picture (.png); invalid = black.")
@click.option("--confidence", "confidence_out", type=click.Path(dir_okay=False),
              help="Also write the confidence map (.pfm/.npy/.tif, float32 in [0, 1]): the margin of the best "
                   "aggregated cost over the runner-up where the disparity passed the uniqueness, left-right and "
                   "speckle tests, 0 where it did not (filled or invalid pixels).")
@geometry_options
@click.option("--rectify", "rectify_with", is_flag=True,
              help="LEFT and RIGHT are raw camera images: rectify them first with the stereo calibration in "
                   "--calib (OpenCV YAML/XML, KITTI calib_cam_to_cam.txt); depth and clouds then use the "
                   "rectified camera.")
@click.option("--timings", is_flag=True, help="Print a per-stage time table (ms) on stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (sizes, range, device, ms) on stdout.")
@click.option("--no-worker", is_flag=True,
              help="Run in this process, not in the background worker that keeps the kernels loaded between "
                   "commands (also: STEREOCLI_NO_WORKER=1).")
def match(left, right, output, fmt, png, sbs, preview, confidence_out, depth_out, ply_out, focal, baseline, doffs,
          calib, rectify_with, timings, as_json, **kw):
    """Compute the disparity map of one rectified pair.

    LEFT is the reference image: pixel (x, y) of LEFT matches (x - d, y) of RIGHT.
    Colour images are converted to grey; 8- and 16-bit inputs are accepted. '-' as
    LEFT or RIGHT reads an encoded image (PNG, JPEG, ...) from standard input.
    Explicit options override the preset, which overrides the built-in defaults.

    \b
    Examples:
      stereo match left.png right.png -o disp.pfm -n 64
      stereo match l.png r.png -o disp.png -n 128 --paths 4 --timings
      stereo match l.png r.png -o disp.pfm --preset quality    # MGM, 2-D fill: slower, more accurate
      stereo match l.png r.png -o disp.npy --cost zncc --window 7 --aggregation none
      stereo match l.png r.png -o disp.tif --min-disparity -16 -n 64 --json
      stereo match l.png r.png -o disp.pfm -n auto --min-disparity auto   # range from feature matches
      stereo match frame.png --sbs -o disp.png               # side-by-side camera frame
      cat l.png | stereo match - r.png -o - --format png > disp.png
      stereo match im0.png im1.png -o d.pfm -n 256 --calib calib.txt --depth z.pfm --ply cloud.ply
      stereo match l.png r.png -o d.pfm --confidence conf.pfm          # how sure each pixel is
      stereo match l.png r.png -o d.png --min-confidence 0.5           # keep the sure half or so
    """
    from .. import geometry, io, pipeline
    from ..backends import get_backend
    from ..outputs import MatchOutputs

    auto = {k for k in ("num_disparities", "min_disparity") if kw.get(k) == "auto"}
    params = params_from({k: (None if k in auto else v) for k, v in kw.items()})
    if sbs and right is not None:
        raise click.UsageError("--sbs takes one side-by-side image; give LEFT only")
    if not sbs and right is None:
        raise click.UsageError("missing argument RIGHT (or give --sbs for one side-by-side image)")
    if left == "-" and right == "-":
        raise StereoError("only one of LEFT and RIGHT can be '-' (standard input); "
                          "use --sbs to pipe one side-by-side frame")
    if rectify_with:
        from .. import rectify
        if not calib:
            raise StereoError("--rectify needs the stereo calibration: --calib FILE (OpenCV YAML/XML or KITTI "
                              "calib_cam_to_cam.txt)")
        stereo_calib = rectify.read_stereo_calibration(calib)
        camera = geometry.camera(focal, baseline, doffs) if (focal or baseline) else None
    else:
        camera = geometry.camera(focal, baseline, doffs, calib)
    def plan():
        return MatchOutputs.plan(output, fmt, params, png=png, preview=preview, depth=depth_out, ply=ply_out,
                                 camera=camera, confidence=confidence_out, json_on_stdout=as_json)

    # the outputs are checked before any work, except what depends on the images: the
    # range of -n auto (what a PNG can hold) and the camera --rectify finds
    outputs = None if auto or (rectify_with and camera is None) else plan()
    left_img = io.read_image(left)
    if sbs:
        left_img, right_img = io.split_side_by_side(left_img, "standard input" if left == "-" else left)
    else:
        right_img = io.read_image(right)
    if rectify_with:
        left_img, right_img, rect_camera = rectify.rectify(left_img, right_img, stereo_calib)
        camera = camera or rect_camera
    if auto:
        params = _auto_range(params, auto, left_img, right_img)
    outputs = outputs or plan()
    warn = (lambda m: click.echo(f"stereo: {m}", err=True)) if timings else None
    backend = get_backend(kw["device"], warn=warn)
    say_if_compiling()
    result = pipeline.run(left_img, right_img, params, backend, confidence=bool(confidence_out))
    for note in result.notes:
        click.echo(f"stereo: note: {note}", err=True)
    outputs.write(result.disparity, left_img, result.confidence)
    h, w = result.disparity.shape
    if timings:
        print_timings(result, backend, w, h, params)
    if as_json:
        valid = float((result.disparity == result.disparity).mean())
        click.echo(json.dumps({
            "left": left, "right": right, "output": str(outputs.disparity), "width": w, "height": h,
            "min_disparity": params.min_disparity, "num_disparities": params.num_disparities,
            "device": result.device, "strips": result.strips, "valid_fraction": round(valid, 6),
            "timings_ms": {k: round(v, 3) for k, v in result.timings.items()},
            "total_ms": round(result.total_ms, 3), "params": params.as_dict(),
        }))


def _auto_range(params, auto, left_img, right_img):
    """params with the disparity range (the parts asked for as 'auto') estimated from the images."""
    import dataclasses

    from .. import autorange
    lo, num, why = autorange.estimate(left_img, right_img)
    if "min_disparity" not in auto:  # -n auto from a given smallest disparity: up to the estimate's top
        num, lo = max(1, lo + num - params.min_disparity), params.min_disparity
        num += -num % 4
    changes = {"min_disparity": lo}
    if "num_disparities" in auto:
        changes["num_disparities"] = num
    params = dataclasses.replace(params, **changes).validate()
    click.echo(f"stereo: auto range {params.min_disparity}..{params.max_disparity} "
               f"({params.num_disparities} disparities): {why}", err=True)
    return params
