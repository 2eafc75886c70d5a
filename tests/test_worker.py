"""The background worker of `stereo match`: the same bytes as in-process, one-line errors
the same way, and in-process work whenever the worker is absent or broken."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import SAMPLE

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="Unix sockets")
LEFT, RIGHT = str(SAMPLE / "left.png"), str(SAMPLE / "right.png")


@pytest.fixture
def env(tmp_path):
    e = {k: v for k, v in os.environ.items() if k not in ("STEREOCLI_NO_WORKER", "NUMBA_ENABLE_CUDASIM")}
    e["STEREOCLI_RUNTIME_DIR"] = str(tmp_path / "run")
    yield e
    state = [json.loads(p.read_text() or "null") for p in (tmp_path / "run").glob("*.lock")]
    for s in state:
        if s:
            try:
                os.kill(s["pid"], signal.SIGTERM)
            except OSError:
                pass


def stereo(env, *args, cwd=None):
    return subprocess.run([sys.executable, "-m", "stereocli.cli", *map(str, args)], capture_output=True, env=env,
                          cwd=cwd)


def worker_state(env):
    from pathlib import Path
    locks = list(Path(env["STEREOCLI_RUNTIME_DIR"]).glob("*.lock"))
    s = json.loads(locks[0].read_text() or "null") if locks else None
    return s if s and list(Path(env["STEREOCLI_RUNTIME_DIR"]).glob("*.sock")) else None


def wait_for_worker(env, timeout=120, other_than=None):
    t = time.time()
    while time.time() - t < timeout:
        s = worker_state(env)
        if s and s["pid"] != other_than:
            return s
        time.sleep(0.2)
    raise AssertionError("no worker started")


def test_match_runs_in_the_worker_with_the_same_output_and_errors(tmp_path, env):
    first = stereo(env, "match", LEFT, RIGHT, "-o", tmp_path / "a.pfm", "-n", 16, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert wait_for_worker(env)["served"] == 0
    # relative paths are the caller's: the worker works in the caller's folder
    r = stereo(env, "match", LEFT, RIGHT, "-o", "b.pfm", "-n", 16, cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == b"", r.stderr
    assert worker_state(env)["served"] == 1
    assert (tmp_path / "b.pfm").read_bytes() == (tmp_path / "a.pfm").read_bytes()
    # standard output comes back byte for byte
    via = stereo(env, "match", LEFT, RIGHT, "-o", "-", "--format", "png", "-n", 16)
    local = stereo(env, "match", LEFT, RIGHT, "-o", "-", "--format", "png", "-n", 16, "--no-worker")
    assert via.returncode == local.returncode == 0 and via.stdout == local.stdout and len(via.stdout) > 1000
    assert worker_state(env)["served"] == 2  # --no-worker did not use it
    # a bad input: one line, exit 2, from the worker as in-process
    bad = stereo(env, "match", LEFT, tmp_path / "nope.png", "-o", tmp_path / "c.pfm", "-n", 16)
    assert bad.returncode == 2 and bad.stderr.decode().count("\n") == 1 and b"no such file" in bad.stderr
    assert worker_state(env)["served"] == 3
    info = stereo(env, "info")
    assert b"running, pid" in info.stdout


def test_a_killed_worker_falls_back_to_in_process_work(tmp_path, env):
    assert stereo(env, "match", LEFT, RIGHT, "-o", tmp_path / "a.pfm", "-n", 16).returncode == 0
    pid = wait_for_worker(env)["pid"]
    os.kill(pid, signal.SIGKILL)  # leaves its socket file behind
    time.sleep(0.2)
    r = stereo(env, "match", LEFT, RIGHT, "-o", tmp_path / "b.pfm", "-n", 16)
    assert r.returncode == 0 and r.stderr == b"", r.stderr
    assert (tmp_path / "b.pfm").read_bytes() == (tmp_path / "a.pfm").read_bytes()
    assert wait_for_worker(env, other_than=pid)["served"] == 0  # and a new worker took over
