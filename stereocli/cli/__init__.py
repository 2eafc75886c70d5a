"""The `stereo` command (Click): one module per command (match, batch, eval as
evaluate, rectify, video, presets and info), the group and entry point in app.py,
shared options in common.py. Commands parse options, load the preset, call the
library and write files; errors become one line and exit status 2 (app.main)."""
from . import batch, evaluate, info, match, rectify, video  # noqa: F401  (register the commands)
from .app import cli, main

__all__ = ["cli", "main"]
