"""The `stereo` command (Click). Parses options, loads the preset, calls the
pipeline, writes files and maps errors to exit codes; nothing else."""
from __future__ import annotations

import json
import sys

import click

from . import __version__, config
from .errors import StereoError

EXIT_USAGE = 2


def _stage_options(f):
    """Options shared by every command that runs the matcher (match, and batch later)."""
    opts = [
        click.option("-n", "--num-disparities", type=int, help="Number of disparities searched [preset: 64]."),
        click.option("--min-disparity", type=int, help="Smallest disparity, may be negative [0]."),
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
      stereo presets default
      stereo info
    """


@cli.command()
@click.argument("left", type=click.Path(dir_okay=False))
@click.argument("right", type=click.Path(dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Disparity file: .pfm (float, inf invalid), .png (16-bit, d*256, 0 invalid), .npy, .tif/.tiff.")
@_stage_options
@click.option("--preview", type=click.Path(dir_okay=False), help="Also write a colour picture (.png); invalid = black.")
@click.option("--timings", is_flag=True, help="Print a per-stage time table (ms) on stderr.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (sizes, range, device, ms) on stdout.")
def match(left, right, output, preview, timings, as_json, **kw):
    """Compute the disparity map of one rectified pair.

    LEFT is the reference image: pixel (x, y) of LEFT matches (x - d, y) of RIGHT.
    Colour images are converted to grey; 8- and 16-bit inputs are accepted.
    Explicit options override the preset, which overrides the built-in defaults.

    \b
    Examples:
      stereo match left.png right.png -o disp.pfm -n 64
      stereo match l.png r.png -o disp.png -n 128 --paths 4 --timings
      stereo match l.png r.png -o disp.npy --cost zncc --window 7 --aggregation none
      stereo match l.png r.png -o disp.tif --min-disparity -16 -n 64 --json
    """
    from . import io, pipeline
    from .backends import get_backend

    params = _params_from(kw)
    out_path, ext = io.check_output_path(output)
    if ext == ".png":
        io.check_png_range(params.min_disparity, params.num_disparities)
    if preview:
        io.check_preview_path(preview)
    left_img, right_img = io.read_image(left), io.read_image(right)
    warn = (lambda m: click.echo(f"stereo: {m}", err=True)) if timings else None
    backend = get_backend(kw["device"], warn=warn)
    result = pipeline.run(left_img, right_img, params, backend)
    io.write_disparity(out_path, result.disparity)
    if preview:
        io.write_preview(preview, result.disparity, params.min_disparity,
                         params.min_disparity + params.num_disparities - 1)
    h, w = result.disparity.shape
    if timings:
        _print_timings(result, backend, w, h, params)
    if as_json:
        valid = float((result.disparity == result.disparity).mean())
        click.echo(json.dumps({
            "left": left, "right": right, "output": str(out_path), "width": w, "height": h,
            "min_disparity": params.min_disparity, "num_disparities": params.num_disparities,
            "device": result.device, "strips": result.strips, "valid_fraction": round(valid, 6),
            "timings_ms": {k: round(v, 3) for k, v in result.timings.items()},
            "total_ms": round(result.total_ms, 3), "params": params.as_dict(),
        }))


def _print_timings(result, backend, w, h, params):
    lines = [f"device: {backend.describe()}   size: {w}x{h}   disparities: "
             f"{params.min_disparity}..{params.min_disparity + params.num_disparities - 1}   strips: {result.strips}"]
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


@cli.command("eval")
@click.argument("estimate", type=click.Path())
@click.argument("ground_truth", type=click.Path())
@click.option("--mask", type=click.Path(dir_okay=False),
              help="Image whose non-zero pixels are evaluated (e.g. Middlebury non-occluded masks).")
@click.option("--max-disparity", type=float, help="Ignore ground truth above this disparity.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per map (and the total) on stdout.")
def eval_cmd(estimate, ground_truth, mask, max_disparity, as_json):
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
      stereo eval results/ gt/ --json
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
    mask_img = io.read_image(mask) != 0 if mask else None
    if mask_img is not None and mask_img.ndim == 3:
        mask_img = mask_img.any(axis=2)
    all_est, all_gt = [], []
    for e, g in pairs:
        est, gt = io.read_disparity(e), io.read_disparity(g)
        if mask_img is not None and mask_img.shape != gt.shape:
            raise StereoError(f"--mask is {mask_img.shape[1]}x{mask_img.shape[0]} but {g} is "
                              f"{gt.shape[1]}x{gt.shape[0]}")
        if mask_img is not None:
            gt = np.where(mask_img, gt, np.nan)
        m = metrics.evaluate(est, gt, max_disparity=max_disparity)
        all_est.append(est.ravel())
        all_gt.append(gt.ravel())
        _print_metrics(str(e), m, as_json)
    if len(pairs) > 1:
        _print_metrics("total", metrics.evaluate(np.concatenate(all_est), np.concatenate(all_gt),
                                                  max_disparity=max_disparity), as_json)


def _print_metrics(name, m, as_json):
    if as_json:
        click.echo(json.dumps({"estimate": name, **{k: round(v, 6) if isinstance(v, float) else v
                                                    for k, v in m.items()}}))
        return
    bad = "  ".join(f"bad{t:g} {100 * m[f'bad{t:g}']:5.2f}%" for t in (0.5, 1, 2, 4))
    click.echo(f"{name}: {bad}  D1 {100 * m['d1']:5.2f}%  density {100 * m['density']:5.1f}%  "
               f"avg {m['avgerr']:.3f}  rms {m['rms']:.3f}  ({m['pixels']} px)")


@cli.command()
def info():
    """Versions, CUDA availability, GPU and compiled-kernel cache: what to paste in a bug report."""
    import platform

    import cv2
    import numba
    import numpy

    from .backends import cuda_status
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
    rows.append(("kernel cache", _cache_dir()))
    for k, v in rows:
        click.echo(f"{k:<14}{v}")


def _cache_dir() -> str:
    import os
    from pathlib import Path
    if os.environ.get("NUMBA_CACHE_DIR"):
        return os.environ["NUMBA_CACHE_DIR"]
    return str(Path(__file__).resolve().parent / "stages" / "__pycache__") + " (NUMBA_CACHE_DIR overrides)"


def main(argv=None) -> int:
    """Entry point: one line on stderr and exit 2 for anything the user can fix."""
    try:
        cli.main(args=argv, prog_name="stereo", standalone_mode=False)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
