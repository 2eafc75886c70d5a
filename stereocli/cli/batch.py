"""`stereo batch`: many pairs, folders or a stream."""
from __future__ import annotations

import json
import sys
import time

import click

from ..errors import StereoError
from .app import cli
from .common import FORMATS, PNG_COMPRESSIONS, IntOrAuto, params_from, print_metrics, say_if_compiling, stage_options


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
@click.option("--png-compression", "png", type=click.Choice(PNG_COMPRESSIONS),
              help="How 16-bit PNG maps are written: fast stores them uncompressed (a tenth of the encode time, "
                   "about 1.5x the bytes; a GPU batch of small pairs ran 1.2x as fast on 16 cores), small "
                   "deflates them as `stereo match` does. Either decodes to the same values. [fast]")
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
@stage_options
@click.option("--threads", type=click.IntRange(1, 64),
              help="Reader and writer threads (decoding/encoding overlap the matching) [one per CPU core, "
                   "4 to 16]; giving it keeps the file work in threads (see --io-processes); with "
                   "--scheduler, per worker [4].")
@click.option("--io-processes", type=IntOrAuto(0, 256), default="auto", show_default=True,
              help="Decode and encode in N worker processes instead of --threads threads (0: threads). "
                   "auto: for a GPU batch of 64 pairs or more on Linux with 8 cores or more, one per core "
                   "but an eighth (28 of 32); else threads. A GPU batch of small pairs ran 1.4x as fast "
                   "in 14 processes as in threads on 16 cores, about 2x in 28 on 32.")
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
def batch(folders, out_dir, left_glob, right_glob, pairs_file, sbs, fmt, png, submission, method_name, preview_dir,
          depth_dir, ply_dir, confidence_dir, error_map_dir, focal, baseline, doffs, calib, threads, io_processes, skip_existing,
          gt_dir, gt_glob, max_disparity, jsonl, progress, scheduler, workers, **kw):
    """Match every pair of two folders (or of a list) and write one map per pair.

    Files pair by name: LEFT_DIR/x.png with RIGHT_DIR/x.png. With --left-glob and
    --right-glob the wildcards pair them ('*_10.png': KITTI; '*/im0.png' and '*/im1.png':
    Middlebury, whose outputs are named after the scene folder). A bad pair is reported
    and skipped; the exit status is 1 if any pair failed (or was not run), 130 if interrupted (Ctrl-C
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
    from .. import batch as B
    from .. import io
    from ..backends import get_backend

    params = params_from(kw)
    png = png or B.PNG_DEFAULT
    if io_processes not in (0, "auto") and scheduler:
        raise click.UsageError("--io-processes is for a batch in this process; a cluster's workers use --threads")
    if workers and scheduler != "local":
        raise click.UsageError("--workers goes with --scheduler local (a remote cluster has its own workers)")
    if scheduler:
        from .. import cluster
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
        from .. import codecs
        from ..backends import gpu_likely
        procs = io_processes
        if io_processes == "auto":  # (--threads asks for threads)
            procs = 0 if threads else B.auto_io_processes(gpu_likely(kw["device"]), None if stream else len(pairs))
        if procs:
            codecs.Workers.get(procs)  # (its processes start while the backend does)
        backend = get_backend(kw["device"], warn=warn)
        if io_processes == "auto" and procs and backend.name != "cuda":  # (no GPU after all)
            codecs.Workers.drop(procs)
            procs = 0
        device_name = backend.name
        say_if_compiling()
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
                cluster.run(pairs, params, kw["device"], ext, scheduler, workers=workers, threads=threads or 4,
                            skip_existing=skip_existing, on_event=on_event, max_disparity=max_disparity,
                            summary=summary, warn=warn, png=png)
            else:
                B.run(pairs, params, backend, ext, threads=threads or B.default_threads(), processes=procs,
                      skip_existing=skip_existing, on_event=on_event, max_disparity=max_disparity, summary=summary,
                      png=png)
        except KeyboardInterrupt:
            code = 130
    if stream and summary.total == 0 and not code:
        raise StereoError("--pairs (stdin) held no pairs; give lines 'left<TAB>right[<TAB>output]'")
    total = summary.total if stream else len(pairs)
    _print_batch_summary(summary, total, bool(gt_dir), no_gt, jsonl, device_name)
    if code:
        return code
    return 1 if summary.failed or summary.total < total else 0  # a pair neither done, failed nor skipped: not run


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
               + f" in {s.seconds:.1f} s ({rate})"
               + (f"; files read and written in {s.io_processes} processes" if s.io_processes else ""), err=True)
    if s.startup_s is not None:
        per = ", ".join(f"{name} {w['ok']} pairs ({w['compute_ms'] / 1e3:.1f} s matching)"
                        for name, w in sorted(s.workers.items()))
        click.echo(f"stereo: cluster ready after {s.startup_s:.1f} s" + (f"; {per}" if per else ""), err=True)
    for left, err in s.failures[:20]:
        click.echo(f"  failed: {left}: {err}", err=True)
    if len(s.failures) > 20:
        click.echo(f"  ... and {len(s.failures) - 20} more failures", err=True)
    if s.interrupted:
        click.echo("stereo: outputs written so far are complete; resume with --skip-existing", err=True)
    if with_gt:
        if s.metric_counts is not None:
            from .. import metrics
            print_metrics(f"ground truth, {s.evaluated} maps", metrics.summarize(s.metric_counts), False,
                           err=True)
        if no_gt:
            click.echo(f"stereo: {no_gt} pairs had no ground-truth file in --gt-dir", err=True)
    if jsonl:
        click.echo(json.dumps({"summary": s.as_dict()}))
