"""What the `stereo` commands share: the matcher's options, output formats, and the
few lines of output more than one command prints."""
from __future__ import annotations

import json
import sys

import click

from .. import config
from ..errors import StereoError  # noqa: F401  (for the command modules)

EXIT_USAGE = 2


class IntOrAuto(click.ParamType):
    """A whole number (within lo..hi when given, as click.IntRange) or 'auto'."""
    name = "N|auto"

    def __init__(self, lo: int | None = None, hi: int | None = None):
        self.lo, self.hi = lo, hi

    def convert(self, value, param, ctx):
        if value == "auto":
            return value
        try:
            n = int(value)
        except ValueError:
            self.fail(f"{value!r} is not a whole number or 'auto'", param, ctx)
        if (self.lo is not None and n < self.lo) or (self.hi is not None and n > self.hi):
            self.fail(f"{n} is not in {self.lo}..{self.hi} (or 'auto')", param, ctx)
        return n


def stage_options(f, auto=False):
    """Options shared by every command that runs the matcher (match, batch); with `auto`,
    -n and --min-disparity also take 'auto' (estimated from the images)."""
    n_type = IntOrAuto() if auto else int
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
        click.option("--window", help="Cost window WxH or N, odd (census up to 9x7; zsad, zssd and zncc larger "
                     "than 1x1) [cost's default]."),
        click.option("--aggregation", type=click.Choice(config.AGGREGATIONS),
                     help="sgm (Semi-Global Matching), mgm (More Global Matching: two neighbours per "
                          "step, no streaks; slower) or none for block matching [sgm; quality: mgm]."),
        click.option("--block", type=int, help="Box aggregation of the costs, odd size, 1 = off [1]."),
        click.option("--paths", type=click.Choice(["4", "8", "16"]), help="SGM path directions; MGM passes (4 or 8) [8]."),
        click.option("--p1", type=int, help="SGM (MGM) penalty for a 1 px disparity step, in cost units (0..255) [40; quality: 30]."),
        click.option("--p2", type=int, help="SGM (MGM) penalty for larger steps [480; quality: 300]."),
        click.option("--adaptive-p2/--no-adaptive-p2", default=None,
                     help="Lower P2 across grey-level edges [on]."),
        click.option("--uniqueness", type=float, help="Percent margin the best cost must win by, 0 = off [5]."),
        click.option("--subpixel/--no-subpixel", default=None, help="Parabola subpixel refinement [on]."),
        click.option("--lr-check/--no-lr-check", default=None, help="Left-right consistency check [on]."),
        click.option("--lr-max-diff", type=float, help="Largest left-right difference kept, px [1]."),
        click.option("--fill", type=click.Choice(config.FILLS),
                     help="Fill rejected pixels. From their row: background = the smaller of the two "
                          "neighbour disparities, nearest = the closer; along the image borders, the surface the "
                          "right camera does not see; slope = background, with that border surface continued "
                          "along its slope (within the disparity range). 2d = that border, then the second "
                          "lowest disparity seen along 8 directions (Hirschmueller) [slope; quality: 2d]."),
        click.option("--median", type=int, help="Median filter size: 0 (off), 3 or 5 [0; fast: 3]."),
        click.option("--weighted-median", type=int, metavar="RADIUS",
                     help="At disparity edges, the median of a window of this radius weighted by colour likeness "
                          "in the left image: depth edges follow the image's edges; 0 = off [4; quality: 8]."),
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


def params_from(kw: dict) -> config.Params:
    overrides = {k: v for k, v in kw.items() if k in config.FIELD_TYPES and v is not None}
    if "paths" in overrides:
        overrides["paths"] = int(overrides["paths"])
    return config.load(kw["preset"], kw.get("config_file"), overrides)


FORMATS = ("png", "pfm", "npy", "tif", "tiff")
PNG_COMPRESSIONS = ("fast", "small")  # io.PNG_COMPRESSIONS (the CLI does not import io until it runs)


def geometry_options(f):
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


def say_if_compiling():
    """On a terminal, a line instead of a silent wait when this install's kernels are not cached yet."""
    from .. import cache
    if sys.stderr.isatty() and cache.is_cold():
        click.echo(f"stereo: compiling the kernels for this install (once; about 20 s on 2 cores), cached in "
                   f"{cache.DIR} ('stereo info --warm-up' does it ahead)", err=True)


def print_timings(result, backend, w, h, params):
    lines = [f"device: {backend.describe()}   size: {w}x{h}   disparities: "
             f"{params.min_disparity}..{params.max_disparity}   strips: {result.strips}"]
    for stage, ms in result.timings.items():
        lines.append(f"  {stage:<11}{ms:10.2f} ms")
    lines.append(f"  {'total':<11}{result.total_ms:10.2f} ms")
    click.echo("\n".join(lines), err=True)


def print_metrics(name, m, as_json, err=False):
    from .. import metrics
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
