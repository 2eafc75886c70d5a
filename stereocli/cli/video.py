"""`stereo video`: a stereo video or camera stream in, a colour disparity video (and/or maps) out."""
from __future__ import annotations

import json
import sys

import click

from .app import cli
from .common import FORMATS, params_from, say_if_compiling, stage_options


@cli.command("video")
@click.argument("input_", metavar="[INPUT]", required=False)
@click.option("--left", "left_in", help="Left video file or camera number (with --right, instead of INPUT).")
@click.option("--right", "right_in", help="Right video file or camera number.")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Colour disparity video: .mp4, .mkv, .mov (MPEG-4) or .avi (Motion JPEG); the input's frame "
                   "rate; colours span the disparity range, black = invalid.")
@click.option("--maps-dir", type=click.Path(file_okay=False),
              help="Also (or instead) write each frame's disparity map, DIR/000000.<format>, ...")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="png", show_default=True,
              help="Format of the maps in --maps-dir.")
@click.option("--every", type=click.IntRange(1), default=1, show_default=True,
              help="Write every N-th map to --maps-dir (the video has every frame).")
@click.option("--max-frames", type=click.IntRange(1), help="Stop after this many frames.")
@stage_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON summary (frames, fps, ms per frame) on stdout.")
@click.option("--progress/--no-progress", default=None, help="Progress on stderr [on when stderr is a terminal].")
def video(input_, left_in, right_in, output, maps_dir, fmt, every, max_frames, as_json, progress, **kw):
    """Match every frame of a stereo video or camera and write a colour disparity video.

    INPUT is one side-by-side video (left half | right half), as most stereo cameras
    record, or a camera number (0, 1, ...) that delivers side-by-side frames; or give
    --left and --right (two files or two cameras). Frames must be rectified. Decoding,
    matching and encoding run at the same time; the end line gives the frames per
    second end to end. From a camera, Ctrl-C ends the recording and keeps it.

    \b
    Examples:
      stereo video drive_sbs.mp4 -o disp.mp4 -n 128
      stereo video --left left.mp4 --right right.mp4 -o disp.avi --preset fast
      stereo video 0 -o live.mp4 -n 64 --max-frames 600          # side-by-side USB camera
      stereo video in_sbs.mkv --maps-dir maps/ --format pfm --every 10
      stereo video in_sbs.mp4 -o disp.mp4 --device cuda --json
    """
    from .. import video as V
    from ..backends import get_backend
    from ..errors import StereoError

    if input_ is not None and (left_in or right_in):
        raise click.UsageError("give INPUT (side-by-side) or --left and --right, not both")
    if input_ is None and not (left_in and right_in):
        raise click.UsageError("give INPUT (a side-by-side video or camera) or both --left and --right")
    params = params_from(kw)
    outputs = V.VideoOutputs.plan(output, maps_dir, fmt, params, every)
    source = V.open_source(sbs=input_, left=left_in, right=right_in)
    show = progress if progress is not None else sys.stderr.isatty()
    warn = (lambda m: click.echo(f"stereo: {m}", err=True)) if show else None
    try:
        backend = get_backend(kw["device"], warn=warn)
    except StereoError:
        source.close()
        raise
    say_if_compiling()
    total = source.frames if max_frames is None else min(max_frames, source.frames or max_frames)

    def on_frame(s):
        if show:
            of = f"/{total}" if total else ""
            click.echo(f"\r\033[Kstereo: frame {s.frames}{of}, {s.fps:.1f} fps", err=True, nl=False)

    try:
        stats = V.run(source, params, backend, outputs, max_frames=max_frames, on_frame=on_frame)
    finally:
        if show:
            click.echo("", err=True)
    for note in stats.notes:
        click.echo(f"stereo: note: {note}", err=True)
    d = stats.as_dict()
    where = " and ".join(str(p) for p in (outputs.video, outputs.maps_dir) if p is not None)
    click.echo(f"stereo: video: {d['frames']} frames {d['width']}x{d['height']} in {d['seconds']:.1f} s, "
               f"{d['fps']:.1f} fps end to end on {stats.device}, {d['steady_fps']:.1f} after the first frame (per frame: decode {d['decode_ms_per_frame']:.1f} "
               f"ms, match {d['match_ms_per_frame']:.1f} ms, colour {d['colour_ms_per_frame']:.1f} ms, "
               f"encode {d['encode_ms_per_frame']:.1f} ms) -> {where}"
               + (" (recording stopped by Ctrl-C)" if stats.interrupted else ""), err=True)
    if as_json:
        click.echo(json.dumps({"input": input_ or [left_in, right_in], "output": output,
                               "maps_dir": maps_dir, **d, "min_disparity": params.min_disparity,
                               "num_disparities": params.num_disparities}))
