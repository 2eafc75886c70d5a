"""The `stereo` command group and its entry point (`main`): one line on stderr and exit
status 2 for anything the user can fix."""
from __future__ import annotations

import sys

import click

from .. import __version__
from ..errors import StereoError
from .common import EXIT_USAGE


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
      stereo video drive_sbs.mp4 -o disp.mp4 -n 128
      stereo presets default
      stereo info
    """


def main(argv=None, in_worker: bool = False) -> int:
    """Entry point: one line on stderr and exit 2 for anything the user can fix.

    `stereo match` is handed to the background worker when one runs (stereocli.worker),
    and a successful in-process match starts one for the next command."""
    args = sys.argv[1:] if argv is None else list(argv)
    if in_worker:
        return _main(args)
    from .. import worker
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
