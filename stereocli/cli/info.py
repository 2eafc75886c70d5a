"""`stereo presets` and `stereo info`."""
from __future__ import annotations

import click

from .. import __version__, config
from .app import cli


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

    from .. import cache, worker
    from ..backends import cuda_status
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
        from ..backends.cuda import gpu_summary
        rows.extend(gpu_summary())
    if warm:
        from .. import pipeline
        from ..backends import get_backend
        for device in ("cpu", "cuda") if ok else ("cpu",):
            click.echo(f"stereo: compiling the {device} kernels (minutes on a small machine) ...", err=True)
            pipeline.warm_up(get_backend(device), report=lambda m: click.echo(f"stereo:   {m}", err=True))
    rows.append(("kernel cache", cache.describe()))
    rows.append(("worker", worker.status()))
    for k, v in rows:
        click.echo(f"{k:<14}{v}")
