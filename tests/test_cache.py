"""Compiled kernels go to a per-user cache folder, never into the installed package."""
import os
import subprocess
import sys

import pytest
from pathlib import Path

import stereocli

PACKAGE = Path(stereocli.__file__).resolve().parent

# A pipeline that compiles few kernels: SAD block matching, no refinement.
SMALL_RUN = ("import numpy as np, stereocli; rng = np.random.default_rng(0); "
             "l = rng.integers(0, 255, (24, 40)).astype(np.uint8); "
             "d, _ = stereocli.match(l, np.roll(l, -3, 1), num_disparities=8, cost='sad', aggregation='none', "
             "lr_check=False, fill='none', median=0, speckle_size=0, subpixel=False); "
             "import stereocli.cache as c; print(c.DIR); print(np.nanmedian(d))")


def run_python(code, **env_changes):
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "STEREOCLI_CACHE_DIR")}
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    env.update(env_changes)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


def kernel_files(folder: Path):
    return sorted(p for p in folder.rglob("*") if p.suffix in (".nbi", ".nbc"))


def test_kernels_are_cached_in_the_user_cache_folder_not_the_package(tmp_path):
    before = kernel_files(PACKAGE)
    r = run_python(SMALL_RUN, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    assert r.returncode == 0, r.stderr
    folder, median = r.stdout.split()
    assert Path(folder) == tmp_path / "xdg" / "stereocli"
    assert float(median) == 3.0
    assert kernel_files(Path(folder)), "nothing was cached"
    assert kernel_files(PACKAGE) == before  # nothing written beside the sources
    assert r.stderr == ""


def test_stereocli_cache_dir_wins_and_clear_cache_empties_it(tmp_path):
    ours, numbas = tmp_path / "ours", tmp_path / "numba"
    r = run_python(SMALL_RUN, STEREOCLI_CACHE_DIR=str(ours), NUMBA_CACHE_DIR=str(numbas))
    assert r.returncode == 0, r.stderr
    assert kernel_files(ours) and not numbas.exists()
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR",)}
    r = subprocess.run([sys.executable, "-m", "stereocli.cli", "info", "--clear-cache"], capture_output=True,
                       text=True, env={**env, "STEREOCLI_CACHE_DIR": str(ours)})
    assert r.returncode == 0, r.stderr
    assert kernel_files(ours) == [] and ours.is_dir()
    assert "deleted" in r.stderr and str(ours) in r.stdout


def test_an_unwritable_cache_folder_compiles_without_a_cache_and_says_so_once(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    before = kernel_files(PACKAGE)
    r = run_python(SMALL_RUN, STEREOCLI_CACHE_DIR=str(blocker / "cache"))
    assert r.returncode == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot be written" in lines[0] and "STEREOCLI_CACHE_DIR" in lines[0]
    assert kernel_files(PACKAGE) == before


KEY_SCRIPT = """
import sys

import pytest
from numba.cuda.dispatcher import CUDACache
from stereocli.backends.cuda import aggregate, cost, select

class Codegen:
    def magic_tuple(self):
        return ("x86_64-unknown-linux-gnu", "sm_90", "")

kernels = [cost.census8_kernel_for(9, 7), select._make_select_kernel(True, int(sys.argv[1]), 8, 4, False, (9, 0)),
           aggregate._make_sgm_kernel(32, 2, True, False, 1, packed=True, cc=(9, 0))]
if not all(isinstance(getattr(k, "_cache", None), CUDACache) for k in kernels):
    print("no cache")
else:
    print([k._cache._index_key(("sig",), Codegen()) for k in kernels])
"""


def test_factory_made_gpu_kernels_have_the_same_cache_key_in_every_process():
    """The SGM, census and selection kernels are made by factories whose closures hold
    device functions; the kernel cache must find them again in the next process (else
    every GPU run compiled them anew: 20 s a `stereo match` on the H200). Keys come
    from fresh processes (string hashing differs between them); another factory
    argument gives another key."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}

    def keys(hold):
        r = subprocess.run([sys.executable, "-c", KEY_SCRIPT, str(hold)], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    first = keys(2)
    if first == "no cache":
        pytest.skip("this Numba has no CUDA kernel cache")
    assert keys(2) == first
    assert keys(1) != first


def test_a_kernel_closure_description_changes_with_every_value_it_holds():
    """The cache key of a factory-made kernel (stable_cache_key) must differ whenever
    the kernel would compile differently: another closure value or default argument
    gives another description (else a process could load a kernel made for other
    arguments), the same ones give the same."""
    from stereocli.backends.cuda.common import _describe

    def make(k, d):
        def f(x, y=d):
            return x + k + y
        return f

    assert _describe(make(1, 2)) == _describe(make(1, 2))
    assert len({_describe(make(1, 2)), _describe(make(1, 3)), _describe(make(2, 2))}) == 3
