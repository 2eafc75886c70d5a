"""The `stereo` command (Click). Parses options, loads the preset, calls the
pipeline, writes files and maps errors to exit codes; nothing else."""
from __future__ import annotations

import json
import sys
import time

import click

from . import __version__, config
from .errors import StereoError

EXIT_USAGE = 2


class _IntOrAuto(click.ParamType):
    name = "N|auto"

    def convert(self, value, param, ctx):
        if isinstance(value, int) or value == "auto":
            return value
        try:
            return int(value)
        except ValueError:
            self.fail(f"{value!r} is not a whole number or 'auto'", param, ctx)


def _stage_options(f, auto=False):
    """Options shared by every command that runs the matcher (match, batch); with `auto`,
    -n and --min-disparity also take 'auto' (estimated from the images)."""
    n_type = _IntOrAuto() if auto else int
    opts = [
        click.option("-n", "--num-disparities", type=n_type,
                     help="Number of disparities searched" + (", or auto (from feature matches)" if auto else "")
                          + " [preset: 64]."),
        click.option("--min-disparity", type=n_type,
                     help="Smallest disparity, may be negative" + (", or auto" if auto else "") + " [0]."),
        click.option("--preset", default="default", show_default=True,
                     help="Preset from configs/ (see 'stereo presets')."),
        click.option("--config", "config_file", type=click.Path(dir_okay=False),
                     help="TOML file of settings applied over the preset."),
        click.option("--device", type=click.Choice(config.DEVICES), default="auto", show_default=True,
                     help="Where to run; auto = CUDA when a usable GPU is present, else CPU."),
        click.option("--preprocess", type=click.Choice(config.PREPROCESS),
                     help="Image prefilter: Difference of Gaussians or bilateral."),
        click.option("--dog-sigma1", type=float, help="DoG inner Gaussian sigma [0.7]."),
        click.option("--dog-sigma2", type=float, help="DoG outer Gaussian sigma [2.5]."),
        click.option("--bilateral-radius", type=int, help="Bilateral filter radius [3]."),
        click.option("--bilateral-sigma-space", type=float, help="Bilateral spatial sigma [2.0]."),
        click.option("--bilateral-sigma-color", type=float, help="Bilateral grey-level sigma [12]."),
        click.option("--cost", type=click.Choice(config.COSTS), help="Matching cost [census]."),
        click.option("--window", help="Cost window WxH or N, odd (census up to 9x7) [cost's default]."),
        click.option("--aggregation", type=click.Choice(config.AGGREGATIONS),
                     help="sgm, or none for block matching [sgm]."),
        click.option("--block", type=int, help="Box aggregation of the costs, odd size, 1 = off [1]."),
        click.option("--paths", type=click.Choice(["4", "8", "16"]), help="SGM path directions [8]."),
        click.option("--p1", type=int, help="SGM penalty for a 1 px disparity step, in cost units (0..255) [40]."),
        click.option("--p2", type=int, help="SGM penalty for larger steps [480]."),
        click.option("--adaptive-p2/--no-adaptive-p2", default=None,
                     help="Lower P2 across grey-level edges [on]."),
        click.option("--uniqueness", type=float, help="Percent margin the best cost must win by, 0 = off [5]."),
        click.option("--subpixel/--no-subpixel", default=None, help="Parabola subpixel refinement [on]."),
        click.option("--lr-check/--no-lr-check", default=None, help="Left-right consistency check [on]."),
        click.option("--lr-max-diff", type=float, help="Largest left-right difference kept, px [1]."),
        click.option("--fill", type=click.Choice(config.FILLS),
                     help="Fill rejected pixels: background = smaller neighbour disparity [background]."),
        click.option("--median", type=int, help="Median filter size: 0 (off), 3 or 5 [3]."),
        click.option("--min-confidence", type=click.FloatRange(0, 1),
                     help="Invalidate pixels whose confidence (see --confidence) is below this; filled pixels "
                          "have 0, so any value > 0 also undoes the fill [0 = off]."),
        click.option("--speckle-size", type=int, help="Remove regions up to this many pixels, 0 = off [100]."),
        click.option("--speckle-diff", type=float, help="Largest step inside one speckle region, px [2]."),
        click.option("--max-memory", type=int,
                     help="Memory budget in MiB for one strip; larger images run in strips [auto]."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _params_from(kw: dict) -> config.Params:
    overrides = {k: v for k, v in kw.items() if k in config.FIELD_TYPES and v is not None}
    if "paths" in overrides:
        overrides["paths"] = int(overrides["paths"])
    return config.load(kw["preset"], kw.get("config_file"), overrides)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="stereo")
def cli():
    """Stereo disparity from rectified image pairs (census / SGM on CPU or CUDA).

    \b
    Examples:
      stereo match left.png right.png -o disp.pfm -n 64
      stereo match left.png right.png -o disp.png --preset fast --preview disp_color.png
      stereo batch left/ right/ -o disp/ -n 128 --gt-dir gt/
      stereo eval disp.pfm gt.pfm
      stereo rectify raw_l.png raw_r.png --calib stereo.yml -o left.png right.png
      stereo presets default
      stereo info
    """


FORMATS = ("png", "pfm", "npy", "tif", "tiff")


def _geometry_options(f):
    opts = [
        click.option("--depth", "depth_out", type=click.Path(dir_okay=False),
                     help="Also write metric depth f*B/(d+doffs) (.pfm/.npy/.tif, float32, invalid = inf/NaN)."),
        click.option("--ply", "ply_out", type=click.Path(dir_okay=False),
                     help="Also write the coloured point cloud of valid pixels (binary .ply)."),
        click.option("--focal", type=float, help="Focal length in pixels (for --depth/--ply)."),
        click.option("--baseline", type=float, help="Baseline; depth comes out in its unit (e.g. mm)."),
        click.option("--doffs", type=float, help="Principal point offset cx_right - cx_left, px [0]."),
        click.option("--calib", type=click.Path(dir_okay=False),
                     help="Middlebury calib.txt giving focal, cx/cy, doffs and baseline; with --rectify, the "
                          "stereo calibration."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


@cli.command()
@click.argument("left")
@click.argument("right", required=False)
@click.option("-o", "--output", required=True,
              help="Disparity file: .pfm (float, inf invalid), .png (16-bit, d*256, 0 invalid), .npy, "
                   ".tif/.tiff; '-' = standard output (needs --format).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), help="Output format (needed with -o -).")
@click.option("--sbs", is_flag=True, help="LEFT is one side-by-side frame (left half | right half); no RIGHT.")
@(lambda f: _stage_options(f, auto=True))
@click.option("--preview", type=click.Path(dir_okay=False), help="Also write a colour picture (.png); invalid = black.")
@click.option("--confidence", "confidence_out", type=click.Path(dir_okay=False),
              help="Also write the confidence map (.pfm/.npy/.tif, float32 in [0, 1]): the margin of the best "
                   "aggregated cost over the runner-up where the disparity passed the uniqueness, left-right and "
                   "speckle tests, 0 where it did not (filled or invalid pixels).")
@_geometry_options
@click.option("--rectify", "rectify_with", is_flag=True,
              help="LEFT and RIGHT are raw camera images: rectify them first with the stereo calibration in "
                   "--calib (OpenCV YAML/XML, KITTI calib_cam_to_cam.txt); depth and clouds then use the "
                   "rectified camera.")
@click.option("--timings", is_flag=True, help="Print a per-stage time table (ms) on stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (sizes, range, device, ms) on stdout.")
@click.option("--no-worker", is_flag=True,
              help="Run in this process, not in the background worker that keeps the kernels loaded between "
                   "commands (also: STEREOCLI_NO_WORKER=1).")
def match(left, right, output, fmt, sbs, preview, confidence_out, depth_out, ply_out, focal, baseline, doffs,
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
      stereo match l.png r.png -o disp.npy --cost zncc --window 7 --aggregation none
      stereo match l.png r.png -o disp.tif --min-disparity -16 -n 64 --json
      stereo match l.png r.png -o disp.pfm -n auto --min-disparity auto   # range from feature matches
      stereo match frame.png --sbs -o disp.png               # side-by-side camera frame
      cat l.png | stereo match - r.png -o - --format png > disp.png
      stereo match im0.png im1.png -o d.pfm -n 256 --calib calib.txt --depth z.pfm --ply cloud.ply
      stereo match l.png r.png -o d.pfm --confidence conf.pfm          # how sure each pixel is
      stereo match l.png r.png -o d.png --min-confidence 0.5           # keep the sure half or so
    """
    from . import geometry, io, pipeline
    from .backends import get_backend
    from .outputs import MatchOutputs

    auto = {k for k in ("num_disparities", "min_disparity") if kw.get(k) == "auto"}
    params = _params_from({k: (None if k in auto else v) for k, v in kw.items()})
    if sbs and right is not None:
        raise click.UsageError("--sbs takes one side-by-side image; give LEFT only")
    if not sbs and right is None:
        raise click.UsageError("missing argument RIGHT (or give --sbs for one side-by-side image)")
    if left == "-" and right == "-":
        raise StereoError("only one of LEFT and RIGHT can be '-' (standard input); "
                          "use --sbs to pipe one side-by-side frame")
    if rectify_with:
        from . import rectify
        if not calib:
            raise StereoError("--rectify needs the stereo calibration: --calib FILE (OpenCV YAML/XML or KITTI "
                              "calib_cam_to_cam.txt)")
        stereo_calib = rectify.read_stereo_calibration(calib)
        camera = geometry.camera(focal, baseline, doffs) if (focal or baseline) else None
    else:
        camera = geometry.camera(focal, baseline, doffs, calib)
    def plan():
        return MatchOutputs.plan(output, fmt, params, preview=preview, depth=depth_out, ply=ply_out,
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
    _say_if_compiling()
    result = pipeline.run(left_img, right_img, params, backend, confidence=bool(confidence_out))
    for note in result.notes:
        click.echo(f"stereo: note: {note}", err=True)
    outputs.write(result.disparity, left_img, result.confidence)
    h, w = result.disparity.shape
    if timings:
        _print_timings(result, backend, w, h, params)
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

    from . import autorange
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


def _say_if_compiling():
    """On a terminal, a line instead of a silent wait when this install's kernels are not cached yet."""
    from . import cache
    if sys.stderr.isatty() and cache.is_cold():
        click.echo(f"stereo: compiling the kernels for this install (once; about 20 s on 2 cores), cached in "
                   f"{cache.DIR} ('stereo info --warm-up' does it ahead)", err=True)


def _print_timings(result, backend, w, h, params):
    lines = [f"device: {backend.describe()}   size: {w}x{h}   disparities: "
             f"{params.min_disparity}..{params.max_disparity}   strips: {result.strips}"]
    for stage, ms in result.timings.items():
        lines.append(f"  {stage:<11}{ms:10.2f} ms")
    lines.append(f"  {'total':<11}{result.total_ms:10.2f} ms")
    click.echo("\n".join(lines), err=True)


@cli.command()
@click.argument("name", required=False)
def presets(name):
    """List the presets, or show one as TOML.

    \b
    Examples:
      stereo presets
      stereo presets quality > my.toml   # edit, then: stereo match ... --config my.toml
    """
    if name:
        click.echo(config.preset_text(name).rstrip())
        return
    for n in config.preset_names():
        click.echo(f"{n:<12}{config.preset_description(n)}")


@cli.command("rectify")
@click.argument("left")
@click.argument("right")
@click.option("--calib", required=True, type=click.Path(dir_okay=False),
              help="Stereo calibration: OpenCV YAML/XML (K1, D1, K2, D2, R, T from stereoCalibrate), KITTI "
                   "calib_cam_to_cam.txt (cameras 2 and 3) or Middlebury calib.txt.")
@click.option("-o", "--output", nargs=2, required=True, metavar="LEFT_OUT RIGHT_OUT",
              help="The two rectified images (.png, .tif, .jpg, ...).")
def rectify_cmd(left, right, calib, output):
    """Rectify a raw stereo pair: undistort both images and turn them so that matching
    points lie on the same row, with a common principal point. Prints the rectified
    camera (focal length in pixels, baseline) for depth.

    \b
    Examples:
      stereo rectify raw_l.png raw_r.png --calib stereo.yml -o left.png right.png
      stereo rectify image_02/0000.png image_03/0000.png --calib calib_cam_to_cam.txt -o l.png r.png
      stereo match raw_l.png raw_r.png --rectify --calib stereo.yml -o disp.pfm -n 128 --depth z.pfm
    """
    from . import io, rectify
    outs = [io.check_image_path(o) for o in output]
    stereo_calib = rectify.read_stereo_calibration(calib)
    left_r, right_r, cam = rectify.rectify(io.read_image(left), io.read_image(right), stereo_calib)
    for path, img in zip(outs, (left_r, right_r)):
        io.write_image(path, img)
    click.echo(f"stereo: rectified camera: focal {cam.focal:.3f} px, baseline {cam.baseline:.6g}, principal "
               f"point ({cam.cx:.2f}, {cam.cy:.2f}); depth = focal * baseline / disparity "
               f"(stereo match ... --focal {cam.focal:.3f} --baseline {cam.baseline:.6g})", err=True)


@cli.command("eval")
@click.argument("estimate", type=click.Path())
@click.argument("ground_truth", type=click.Path())
@click.option("--mask", type=click.Path(dir_okay=False),
              help="Image whose non-zero pixels are evaluated (e.g. Middlebury non-occluded masks).")
@click.option("--max-disparity", type=float, help="Ignore ground truth above this disparity.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per map (and the total) on stdout.")
@click.option("--error-map", type=click.Path(),
              help="Write KITTI-style error pictures: a .png file for two files, a folder (NAME.png each) for "
                   "two folders. Blue to red = error below to far above D1's 3 px / 5 %; magenta = no "
                   "estimate; black = no ground truth.")
@click.option("--confidence", type=click.Path(),
              help="Confidence map(s) of the estimate (from match --confidence): a file, or a folder for two "
                   "folders. Also prints the sparsification figures: bad-2 of the 50 % most confident pixels, "
                   "of all, and the area under the bad-2 sparsification curve (and the best possible area).")
def eval_cmd(estimate, ground_truth, mask, max_disparity, as_json, error_map, confidence):
    """Compare disparity maps with ground truth (Middlebury/KITTI metrics).

    ESTIMATE and GROUND_TRUTH are two files, or two folders whose files pair by name
    (stem). Any format `match` writes is read, plus Middlebury PFM (inf = unknown) and
    KITTI 16-bit PNG (value/256, 0 = unknown) ground truth.

    bad-t: share of ground-truth pixels whose estimate is off by more than t px or
    missing; "(est)": the same over estimated pixels only; D1: error > 3 px and > 5 %.
    The folder total is over all pixels of all maps.

    \b
    Examples:
      stereo eval disp.pfm sample_data/disp.pfm
      stereo eval disp.pfm sample_data/disp.pfm --error-map errors.png
      stereo eval results/ gt/ --json --error-map error_maps/
      stereo eval disp.pfm sample_data/disp.pfm --confidence conf.pfm
    """
    from pathlib import Path

    import numpy as np

    from . import io, metrics
    est_p, gt_p = Path(estimate), Path(ground_truth)
    if est_p.is_dir() != gt_p.is_dir():
        raise StereoError("give two files or two folders")
    if est_p.is_dir():
        gts = {p.stem: p for p in sorted(gt_p.iterdir()) if p.suffix.lower() in io.DISPARITY_FORMATS}
        pairs = [(p, gts[p.stem]) for p in sorted(est_p.iterdir()) if p.stem in gts
                 and p.suffix.lower() in io.DISPARITY_FORMATS]
        if not pairs:
            raise StereoError(f"no file of {est_p} has a ground-truth file of the same name in {gt_p}")
    else:
        pairs = [(est_p, gt_p)]
    if error_map:
        if est_p.is_dir():
            Path(error_map).mkdir(parents=True, exist_ok=True)
        else:
            io.check_preview_path(error_map)
    conf_files = {}
    if confidence:
        conf_p = Path(confidence)
        if conf_p.is_dir() != est_p.is_dir():
            raise StereoError("--confidence is a file for two files, a folder for two folders")
        if conf_p.is_dir():
            conf_files = {p.stem: p for p in conf_p.iterdir() if p.suffix.lower() in io.DISPARITY_FORMATS}
            missing = [e.stem for e, _ in pairs if e.stem not in conf_files]
            if missing:
                raise StereoError(f"{conf_p} has no confidence map named {missing[0]} (of {len(missing)} missing); "
                                  f"give the folder that match/batch --confidence wrote")
        else:
            conf_files = {est_p.stem: conf_p}
    ranked = []
    mask_img = io.read_image(mask) != 0 if mask else None
    if mask_img is not None and mask_img.ndim == 3:
        mask_img = mask_img.any(axis=2)
    total = None
    for e, g in pairs:
        est, gt = io.read_disparity(e), io.read_disparity(g)
        if mask_img is not None and mask_img.shape != gt.shape:
            raise StereoError(f"--mask is {mask_img.shape[1]}x{mask_img.shape[0]} but {g} is "
                              f"{gt.shape[1]}x{gt.shape[0]}")
        c = metrics.counts(est, gt, mask=mask_img, max_disparity=max_disparity)
        if error_map:
            target = Path(error_map) / f"{e.stem}.png" if est_p.is_dir() else Path(error_map)
            io.write_image(target, metrics.error_image(est, gt))
        total = metrics.add(total, c)
        m = metrics.summarize(c)
        if confidence:
            ranked.append(metrics.confidence_ranking(io.read_disparity(conf_files[e.stem]), est, gt, mask_img,
                                                     max_disparity))
            m["sparsification"] = metrics.sparsification(*ranked[-1])
        _print_metrics(str(e), m, as_json)
    if len(pairs) > 1:
        m = metrics.summarize(total)
        if confidence:
            m["sparsification"] = metrics.sparsification(np.concatenate([r[0] for r in ranked]),
                                                         np.concatenate([r[1] for r in ranked]))
        _print_metrics("total", m, as_json)


def _print_metrics(name, m, as_json, err=False):
    from . import metrics
    if as_json:
        out = {"estimate": name, **metrics.rounded(m)}
        if "sparsification" in m:
            out["sparsification"] = metrics.rounded(m["sparsification"])
        click.echo(json.dumps(out))
        return
    bad = "  ".join(f"bad{t:g} {100 * m[f'bad{t:g}']:5.2f}%" for t in (0.5, 1, 2, 4))
    click.echo(f"{name}: {bad}  D1 {100 * m['d1']:5.2f}%  density {100 * m['density']:5.1f}%  "
               f"avg {m['avgerr']:.3f}  rms {m['rms']:.3f}  ({m['pixels']} px)", err=err)
    if "sparsification" in m:
        s = m["sparsification"]
        click.echo(f"{' ' * len(name)}  confidence: bad2 of the most confident 50 % {100 * s['bad_top50']:5.2f}% "
                   f"(all {100 * s['bad_all']:5.2f}%)  sparsification AUC {100 * s['auc']:5.2f}% "
                   f"(best possible {100 * s['auc_optimal']:5.2f}%)", err=err)


@cli.command()
@click.argument("folders", nargs=-1, type=click.Path(file_okay=False), metavar="[LEFT_DIR [RIGHT_DIR]]")
@click.option("-o", "--output", "out_dir", required=True,
              help="Output folder (created if missing) or fsspec URL; each map is OUT_DIR/<left stem>.<format>.")
@click.option("--left-glob", help="Pattern of left images inside LEFT_DIR, e.g. '*_10.png', '*/im0.png', "
                                  "'left_{name}.png' [every image].")
@click.option("--right-glob", help="Pattern of right images inside RIGHT_DIR [same as --left-glob].")
@click.option("--pairs", "pairs_file", type=click.Path(dir_okay=False, allow_dash=True),
              help="File of lines 'left<TAB>right[<TAB>output]' instead of folders; '-' = stdin, matched line by "
                   "line as the lines arrive (a pipeline's stream). Relative "
                   "inputs are relative to the current folder, relative outputs to -o. Paths may be fsspec URLs "
                   "(s3://..., file://...).")
@click.option("--sbs", is_flag=True, help="Inputs are side-by-side frames (left half | right half); one folder.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="png", show_default=True,
              help="Output format.")
@click.option("--submission", type=click.Choice(["kitti", "middlebury"]),
              help="Write the layout a benchmark's devkit reads: KITTI disp_0/NAME.png (16-bit), or Middlebury "
                   "2014 NAME/disp0METHOD.pfm with NAME/timeMETHOD.txt (seconds per pair).")
@click.option("--method-name", default="stereocli", show_default=True,
              help="METHOD in Middlebury submission file names (letters and digits).")
@click.option("--preview-dir", type=click.Path(file_okay=False), help="Also write colour previews, DIR/NAME.png.")
@click.option("--depth-dir", type=click.Path(file_okay=False),
              help="Also write depth maps f*B/(d+doffs), DIR/NAME.pfm (needs --focal/--baseline or --calib).")
@click.option("--ply-dir", type=click.Path(file_okay=False), help="Also write coloured point clouds, DIR/NAME.ply.")
@click.option("--confidence-dir", type=click.Path(file_okay=False),
              help="Also write confidence maps (see match --confidence), DIR/NAME.pfm.")
@click.option("--error-map-dir", type=click.Path(file_okay=False),
              help="With --gt-dir: also write KITTI-style error pictures (see eval --error-map), DIR/NAME.png.")
@click.option("--focal", type=float, help="Focal length in pixels (for --depth-dir/--ply-dir).")
@click.option("--baseline", type=float, help="Baseline; depth comes out in its unit.")
@click.option("--doffs", type=float, help="Principal point offset cx_right - cx_left, px [0].")
@click.option("--calib", help="Middlebury calib.txt for every pair; a bare name (e.g. calib.txt) is looked up "
                              "in each left image's folder (one per scene).")
@_stage_options
@click.option("--threads", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Reader and writer threads (decoding/encoding overlap the matching); with --scheduler "
                   "local, threads per worker.")
@click.option("--skip-existing", is_flag=True, help="Skip pairs whose output exists (resume a run).")
@click.option("--gt-dir", type=click.Path(file_okay=False),
              help="Ground-truth folder: evaluate each map as it is written, print the total at the end.")
@click.option("--gt-glob", help="Pattern of ground-truth files in --gt-dir (same key rules as --left-glob) "
                                "[same name as the output].")
@click.option("--max-disparity", type=float, help="With --gt-dir: ignore ground truth above this disparity.")
@click.option("--jsonl", is_flag=True, help="One JSON line per pair on stdout, then one {\"summary\": ...} line.")
@click.option("--progress/--no-progress", default=None,
              help="Progress bar on stderr [on when stderr is a terminal].")
@click.option("--scheduler", metavar="ADDRESS|local",
              help="Run on a Dask cluster: a scheduler address (tcp://host:8786) or 'local' to start one here "
                   "(needs pip install 'stereocli[dask]').")
@click.option("--workers", type=click.IntRange(1, 1024),
              help="With --scheduler local: worker processes [one per GPU with CUDA, else 2]; more than the "
                   "GPUs puts several on each GPU.")
def batch(folders, out_dir, left_glob, right_glob, pairs_file, sbs, fmt, submission, method_name, preview_dir,
          depth_dir, ply_dir, confidence_dir, error_map_dir, focal, baseline, doffs, calib, threads, skip_existing,
          gt_dir, gt_glob, max_disparity, jsonl, progress, scheduler, workers, **kw):
    """Match every pair of two folders (or of a list) and write one map per pair.

    Files pair by name: LEFT_DIR/x.png with RIGHT_DIR/x.png. With --left-glob and
    --right-glob the wildcards pair them ('*_10.png': KITTI; '*/im0.png' and '*/im1.png':
    Middlebury, whose outputs are named after the scene folder). A bad pair is reported
    and skipped; the exit status is 1 if any pair failed, 130 if interrupted (Ctrl-C
    leaves no half-written file; run again with --skip-existing to resume).

    \b
    Examples:
      stereo batch left/ right/ -o disp/ -n 128
      stereo batch kitti/training/image_2 kitti/training/image_3 -o out/ -n 128 \\
          --left-glob '*_10.png' --gt-dir kitti/training/disp_noc_0
      stereo batch mb/ mb/ -o out/ --left-glob '*/im0.png' --right-glob '*/im1.png' --format pfm
      stereo batch testing/image_2 testing/image_3 -o sub/ -n 192 --left-glob '*_10.png' --submission kitti
      stereo batch MiddEval3/testF MiddEval3/testF -o sub/ --left-glob '*/im0.png' --right-glob '*/im1.png' \\
          --submission middlebury --method-name mine
      stereo batch frames/ --sbs -o disp/ --skip-existing
      stereo batch mb/ mb/ -o out/ --left-glob '*/im0.png' --right-glob '*/im1.png' --calib calib.txt \\
          --depth-dir depth/ --ply-dir clouds/ --preview-dir previews/
      stereo batch left/ right/ -o disp/ --gt-dir gt/ --error-map-dir errors/ --confidence-dir conf/
      find . -name 'l_*.png' | sed 's/\\(.*\\)l_\\(.*\\)/&\\t\\1r_\\2/' | stereo batch --pairs - -o out/
      producer | stereo batch --pairs - -o out/ --jsonl | consumer   # one process serves a stream
      stereo batch left/ right/ -o disp/ --jsonl | jq -c 'select(.status != "ok")'
      stereo batch left/ right/ -o disp/ --scheduler local --device cuda   # one worker per GPU
      stereo batch /shared/left /shared/right -o /shared/out --scheduler tcp://head:8786
    """
    from . import batch as B
    from . import io
    from .backends import get_backend

    params = _params_from(kw)
    if workers and scheduler != "local":
        raise click.UsageError("--workers goes with --scheduler local (a remote cluster has its own workers)")
    if scheduler:
        from . import cluster
        cluster._require_dask()
    if submission:
        if not method_name.isalnum():
            raise StereoError(f"--method-name must be letters and digits, not {method_name!r}")
        fmt = "png" if submission == "kitti" else "pfm"
    ext = "." + fmt
    if ext == ".png":
        io.check_png_range(params.min_disparity, params.max_disparity)
    want = 0 if pairs_file else (1 if sbs else 2)
    if len(folders) != want:
        if pairs_file:
            raise click.UsageError("--pairs replaces LEFT_DIR and RIGHT_DIR; give only one of them")
        raise click.UsageError("give one folder of side-by-side frames with --sbs" if sbs
                               else "give LEFT_DIR and RIGHT_DIR (or --pairs FILE)")
    stream = pairs_file == "-" and not scheduler  # match each line's pair as soon as it arrives
    pairs = B.collect_pairs(folders, out_dir, ext, pairs_file=pairs_file, sbs=sbs, left_glob=left_glob,
                            right_glob=right_glob, gt_dir=gt_dir, gt_glob=gt_glob, stream=stream,
                            submission=submission, method=method_name, extras=_batch_extras(
                                preview_dir, depth_dir, ply_dir, confidence_dir, error_map_dir, gt_dir, focal,
                                baseline, doffs, calib, params))
    show_bar = not stream and (progress if progress is not None else sys.stderr.isatty())
    warn = (lambda m: click.echo(f"stereo: {m}", err=True)) if show_bar else None
    if scheduler:
        device_name = f"dask {scheduler}"
    else:
        backend = get_backend(kw["device"], warn=warn)
        device_name = backend.name
        _say_if_compiling()
    summary = B.Summary()
    bar = click.progressbar(length=0 if stream else len(pairs), label="matching", file=sys.stderr,
                            hidden=not show_bar, show_pos=True, show_eta=True, item_show_func=lambda s: s, width=24)
    t0 = time.perf_counter()
    notes_told = set()
    no_gt = 0

    def on_event(ev):
        nonlocal no_gt
        no_gt += bool(gt_dir) and "gt" not in ev
        for note in ev.get("notes", ()):
            if note not in notes_told:
                notes_told.add(note)
                click.echo(("\r\033[K" if show_bar else "") + f"stereo: note: {note}", err=True)
        if ev["status"] == "failed":
            click.echo(("\r\033[K" if show_bar else "") + f"stereo: failed: {ev['left']}: {ev['error']}", err=True)
        if jsonl:
            click.echo(json.dumps(ev))
        dt = time.perf_counter() - t0
        rate = summary.done / dt if dt > 0 else 0.0
        bar.update(1, f"{rate:.1f} pairs/s" + (f", {summary.failed} failed" if summary.failed else ""))

    code = 0
    with bar:
        try:
            if scheduler:
                cluster.run(pairs, params, kw["device"], ext, scheduler, workers=workers, threads=threads,
                            skip_existing=skip_existing, on_event=on_event, max_disparity=max_disparity,
                            summary=summary, warn=warn)
            else:
                B.run(pairs, params, backend, ext, threads=threads, skip_existing=skip_existing,
                      on_event=on_event, max_disparity=max_disparity, summary=summary)
        except KeyboardInterrupt:
            code = 130
    if stream and summary.total == 0 and not code:
        raise StereoError("--pairs (stdin) held no pairs; give lines 'left<TAB>right[<TAB>output]'")
    _print_batch_summary(summary, summary.total if stream else len(pairs), bool(gt_dir), no_gt, jsonl,
                         device_name)
    if code:
        return code
    return 1 if summary.failed else 0


def _batch_extras(preview_dir, depth_dir, ply_dir, confidence_dir, error_map_dir, gt_dir, focal, baseline, doffs,
                  calib, params):
    """with_extras' arguments, or None when no extra file was asked for."""
    if not (preview_dir or depth_dir or ply_dir or confidence_dir or error_map_dir):
        return None
    if (depth_dir or ply_dir) and not calib and not (focal and baseline):
        raise StereoError("--depth-dir and --ply-dir need --focal and --baseline, or --calib")
    if error_map_dir and not gt_dir:
        raise StereoError("--error-map-dir compares with ground truth: give --gt-dir too")
    return {"preview_dir": preview_dir, "depth_dir": depth_dir, "ply_dir": ply_dir,
            "confidence_dir": confidence_dir, "error_map_dir": error_map_dir,
            "camera": (focal, baseline, doffs, calib),
            "disparity_range": (params.min_disparity, params.max_disparity)}


def _print_batch_summary(s, total, with_gt, no_gt, jsonl, device):
    rate = f"{s.done / s.seconds:.2f} pairs/s" if s.seconds > 0 else "-"
    head = "interrupted after" if s.interrupted else f"batch on {device}:"
    not_run = total - s.total
    click.echo(f"stereo: {head} {s.done} done, {s.failed} failed, {s.skipped} skipped"
               + (f", {not_run} not run" if not_run else "")
               + f" in {s.seconds:.1f} s ({rate})", err=True)
    for left, err in s.failures[:20]:
        click.echo(f"  failed: {left}: {err}", err=True)
    if len(s.failures) > 20:
        click.echo(f"  ... and {len(s.failures) - 20} more failures", err=True)
    if s.interrupted:
        click.echo("stereo: outputs written so far are complete; resume with --skip-existing", err=True)
    if with_gt:
        if s.metric_counts is not None:
            from . import metrics
            _print_metrics(f"ground truth, {s.evaluated} maps", metrics.summarize(s.metric_counts), False,
                           err=True)
        if no_gt:
            click.echo(f"stereo: {no_gt} pairs had no ground-truth file in --gt-dir", err=True)
    if jsonl:
        click.echo(json.dumps({"summary": s.as_dict()}))


@cli.command()
@click.option("--clear-cache", is_flag=True,
              help="Delete stereocli's compiled kernels from the cache folder (the next run compiles again).")
@click.option("--warm-up", "warm", is_flag=True,
              help="Compile the kernels of the presets now (CPU, and CUDA when usable), e.g. in a Dockerfile, "
                   "so that no later run waits for the compiler.")
@click.option("--stop-worker", is_flag=True, help="Stop the background worker of `stereo match` (see below).")
def info(clear_cache, warm, stop_worker):
    """Versions, CUDA availability, GPU and compiled-kernel cache: what to paste in a bug report.

    Compiled kernels are cached in a per-user folder: $STEREOCLI_CACHE_DIR, else
    $NUMBA_CACHE_DIR, else the platform's user cache folder ($XDG_CACHE_HOME/stereocli,
    by default ~/.cache/stereocli, on Linux).

    After a `stereo match`, a background worker of the user's keeps the kernels (and a
    GPU context) loaded, and later `stereo match` commands run in it, over a Unix socket
    in a private folder; it stops after 10 idle minutes. `--no-worker` or
    STEREOCLI_NO_WORKER=1 turn it off.

    \b
    Examples:
      stereo info
      stereo info --clear-cache
      stereo info --warm-up          # compile everything now (a Dockerfile's RUN step)
      stereo info --stop-worker
      STEREOCLI_CACHE_DIR=/opt/stereo-cache stereo match l.png r.png -o d.pfm
    """
    import platform

    import cv2
    import numba
    import numpy

    from . import cache, worker
    from .backends import cuda_status
    if stop_worker:
        stopped = worker.stop()
        click.echo("stereo: stopped the background worker" if stopped else "stereo: no background worker runs",
                   err=True)
    if clear_cache:
        n = cache.clear()
        click.echo(f"stereo: deleted {n} compiled-kernel files from {cache.DIR}", err=True)
    rows = [("stereocli", __version__), ("python", platform.python_version()), ("numpy", numpy.__version__),
            ("numba", numba.__version__), ("opencv", cv2.__version__),
            ("cpu threads", str(numba.get_num_threads()))]
    try:
        from importlib.metadata import version
        rows.append(("numba-cuda", version("numba-cuda")))
    except Exception:
        rows.append(("numba-cuda", "not installed (pip install 'stereocli[cuda]')"))
    ok, why = cuda_status()
    rows.append(("cuda usable", "yes" if ok else f"no: {why}"))
    if ok:
        from .backends.cuda import gpu_summary
        rows.extend(gpu_summary())
    if warm:
        from . import pipeline
        from .backends import get_backend
        for device in ("cpu", "cuda") if ok else ("cpu",):
            click.echo(f"stereo: compiling the {device} kernels (minutes on a small machine) ...", err=True)
            pipeline.warm_up(get_backend(device), report=lambda m: click.echo(f"stereo:   {m}", err=True))
    rows.append(("kernel cache", cache.describe()))
    rows.append(("worker", worker.status()))
    for k, v in rows:
        click.echo(f"{k:<14}{v}")


def main(argv=None, in_worker: bool = False) -> int:
    """Entry point: one line on stderr and exit 2 for anything the user can fix.

    `stereo match` is handed to the background worker when one runs (stereocli.worker),
    and a successful in-process match starts one for the next command."""
    args = sys.argv[1:] if argv is None else list(argv)
    if in_worker:
        return _main(args)
    from . import worker
    use_worker = worker.enabled(args)
    if use_worker:
        rv = worker.try_run(args)
        if rv is not None:
            return rv
    rv = _main(args)
    if use_worker and rv == 0:
        worker.start()
    return rv


def _main(argv) -> int:
    try:
        rv = cli.main(args=argv, prog_name="stereo", standalone_mode=False)
    except BrokenPipeError:  # e.g. `stereo batch --jsonl | head`: the reader left; not an error of ours
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141
    except StereoError as e:
        click.echo(f"stereo: error: {e}", err=True)
        return EXIT_USAGE
    except click.UsageError as e:
        cmd = e.ctx.command_path if e.ctx else "stereo"
        click.echo(f"{cmd}: error: {e.format_message()} (see '{cmd} --help')", err=True)
        return EXIT_USAGE
    except click.ClickException as e:
        click.echo(f"stereo: error: {e.format_message()}", err=True)
        return e.exit_code
    except click.Abort:
        click.echo("stereo: interrupted", err=True)
        return 130
    except KeyboardInterrupt:
        click.echo("stereo: interrupted", err=True)
        return 130
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
