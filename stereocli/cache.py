"""Where compiled kernels are cached: a folder of the user's, never the installed package.

The folder is the first of
  1. $STEREOCLI_CACHE_DIR
  2. $NUMBA_CACHE_DIR (Numba's own variable)
  3. the platform's user cache folder: $XDG_CACHE_HOME/stereocli (default
     ~/.cache/stereocli) on Linux, ~/Library/Caches/stereocli on macOS,
     %LOCALAPPDATA%\\stereocli\\Cache on Windows.
This module is imported by `stereocli/__init__` before anything imports numba, and
hands the folder to Numba through NUMBA_CACHE_DIR, which both its CPU and its CUDA
caches read. Left to itself Numba would write `*.nbi`/`*.nbc` files beside the
sources, inside site-packages: a later `pip install -e .` then leaves a stray
`stereocli/` folder there that shadows the editable install, and a read-only
install cannot cache at all.

If the folder cannot be written, kernels are compiled in every process instead
(`ENABLED` is False, every kernel is declared with `cache=ENABLED`) and one line on
stderr says so; nothing is written anywhere else.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile

APP = "stereocli"
# Numba names a source folder's cache subfolder '<folder name>_<sha1 of its path>'.
_OUR_SUBFOLDER = re.compile(r"^(stages|backends|cuda)_[0-9a-f]{40}$")


def _default_dir() -> str:
    try:
        from platformdirs import user_cache_dir
        return user_cache_dir(APP, appauthor=False)
    except ImportError:  # pragma: no cover - platformdirs is a dependency
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(base, APP)


def _choose() -> tuple[str, str]:
    """(folder, where it came from)."""
    for var in ("STEREOCLI_CACHE_DIR", "NUMBA_CACHE_DIR"):
        if os.environ.get(var):
            return os.path.abspath(os.path.expanduser(os.environ[var])), var
    return _default_dir(), "user cache folder"


def _writable(folder: str) -> str | None:
    """None if kernels can be cached in `folder` (created if missing), else why not."""
    try:
        os.makedirs(folder, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return e.strerror or str(e)
    return None


DIR, SOURCE = _choose()
PROBLEM = _writable(DIR)
ENABLED = PROBLEM is None

if ENABLED:
    os.environ["NUMBA_CACHE_DIR"] = DIR  # read by numba (and numba-cuda) when imported, and on reload
    for _mod in ("numba.core.config", "numba.cuda.core.config"):  # numba imported before stereocli
        if _mod in sys.modules:
            sys.modules[_mod].CACHE_DIR = DIR
else:
    print(f"stereo: note: the kernel cache folder {DIR} cannot be written ({PROBLEM}); compiling without "
          f"a cache, so every run compiles (set STEREOCLI_CACHE_DIR to a writable folder)", file=sys.stderr)


def is_cold() -> bool:
    """True when nothing of this install's kernels is cached yet (its first run compiles)."""
    if not ENABLED:
        return True
    import hashlib
    stages = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stages")
    sub = os.path.join(DIR, "stages_" + hashlib.sha1(stages.encode()).hexdigest())
    try:
        return not any(n.endswith(".nbi") for n in os.listdir(sub))
    except OSError:
        return True


def describe() -> str:
    """One line for `stereo info`."""
    if not ENABLED:
        return f"{DIR} (from {SOURCE}): not writable ({PROBLEM}), kernels are not cached"
    files = list(_our_files())
    size = sum(_size(f) for f in files)
    hint = "" if SOURCE == "STEREOCLI_CACHE_DIR" else "; STEREOCLI_CACHE_DIR overrides"
    return f"{DIR} (from {SOURCE}{hint}): {len(files)} files, {size / 2 ** 20:.1f} MiB"


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _our_folders() -> list[str]:
    """Numba's cache subfolders of stereocli's sources inside DIR (of any install of it)."""
    try:
        return [e.path for e in os.scandir(DIR) if e.is_dir() and _OUR_SUBFOLDER.match(e.name)]
    except OSError:
        return []


def _our_files():
    """Numba's cache files of stereocli's kernels inside DIR."""
    for folder in _our_folders():
        for root, _, names in os.walk(folder):
            for n in names:
                if n.endswith((".nbi", ".nbc")):
                    yield os.path.join(root, n)


def kernel_count() -> int:
    """Compiled kernels (Numba's data files) of stereocli's in DIR: a process that adds
    some compiled them, one that adds none found every kernel in the cache."""
    return sum(1 for f in _our_files() if f.endswith(".nbc"))


def clear() -> int:
    """Delete stereocli's compiled kernels from DIR (nothing else there) -> files deleted."""
    n = 0
    for f in list(_our_files()):
        try:
            os.unlink(f)
            n += 1
        except OSError:
            pass
    for folder in _our_folders():  # remove what is now empty, deepest first
        for root, _, _ in sorted(os.walk(folder), key=lambda t: -len(t[0])):
            try:
                os.rmdir(root)
            except OSError:
                pass
    return n
