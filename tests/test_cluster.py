"""`stereo batch --scheduler`: the batch on a real Dask cluster (worker processes on the CPU)."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import cv2
import pytest

pytest.importorskip("distributed")

from conftest import SAMPLE  # noqa: E402
from test_batch import N, crops, kitti_tree  # noqa: E402,F401
from test_cli import stereo  # noqa: E402

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def files(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_local_cluster_equals_in_process_batch_with_a_corrupt_pair(tmp_path, crops):  # noqa: F811
    kitti_tree(tmp_path / "k", crops, corrupt=1)
    args = ("batch", tmp_path / "k/image_2", tmp_path / "k/image_3", "--left-glob", "*_10.png", "--jsonl", *N)
    here = stereo(*args, "-o", tmp_path / "here")
    there = stereo(*args, "-o", tmp_path / "there", "--scheduler", "local", "--workers", 2)
    assert here.returncode == there.returncode == 1, there.stderr
    assert "Traceback" not in there.stderr
    assert files(tmp_path / "here") == files(tmp_path / "there")  # bit for bit
    assert sorted(files(tmp_path / "there")) == ["000000_10.png", "000002_10.png"]
    s_here = json.loads(here.stdout.splitlines()[-1])["summary"]
    s_there = json.loads(there.stdout.splitlines()[-1])["summary"]
    assert [s_there[k] for k in ("done", "failed", "skipped")] == [s_here[k] for k in ("done", "failed", "skipped")]
    assert s_there["startup_s"] > 0 and "startup_s" not in s_here  # what the cluster cost, and who did what
    assert sum(w["ok"] for w in s_there["workers"].values()) == 2 and set(s_there["workers"]) <= {"cpu-0", "cpu-1"}
    assert "cluster ready after" in there.stderr
    failed = [json.loads(x) for x in there.stdout.splitlines()[:-1] if '"failed"' in x]
    assert len(failed) == 1 and failed[0]["attempts"] == 2 and "cannot decode" in failed[0]["error"]
    assert "2 done, 1 failed, 0 skipped" in there.stderr
    # resume on the cluster: everything present is skipped
    again = stereo(*args, "-o", tmp_path / "there", "--scheduler", "local", "--workers", 2, "--skip-existing")
    assert "0 done, 1 failed, 2 skipped" in again.stderr


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_remote_scheduler_survives_a_killed_worker(tmp_path):
    """A scheduler and two workers started as a user would; one worker is killed (SIGKILL)
    in the middle of the batch: its pairs are redone elsewhere and every output is whole."""
    left, right = cv2.imread(str(SAMPLE / "left.png")), cv2.imread(str(SAMPLE / "right.png"))
    for d in ("L", "R"):
        (tmp_path / d).mkdir()
    for i in range(60):
        cv2.imwrite(str(tmp_path / f"L/{i:03d}.png"), left)
        cv2.imwrite(str(tmp_path / f"R/{i:03d}.png"), right)
    addr = f"tcp://127.0.0.1:{_free_port()}"
    logs = {name: tmp_path / f"{name}.log" for name in ("scheduler", "worker-0", "worker-1")}
    handles = {name: path.open("w") for name, path in logs.items()}
    env = {**ENV, "PYTHONFAULTHANDLER": "1"}  # (a hung batch, sent SIGABRT below, prints every thread's stack)
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
                               addr.rsplit(":", 1)[1], "--no-dashboard"], stderr=handles["scheduler"], env=env)]
    batch = None
    try:
        workers = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", addr, "--nthreads", "1",
                                     "--no-nanny", "--no-dashboard"], stderr=handles[f"worker-{i}"],
                                    env={**env, "NUMBA_NUM_THREADS": "1"}) for i in range(2)]
        procs += workers
        from distributed import Client
        with Client(addr, timeout="60s") as c:  # both workers up before the batch starts
            c.wait_for_workers(2, timeout=120)
        out = tmp_path / "out"
        batch = subprocess.Popen([sys.executable, "-m", "stereocli.cli", "batch", str(tmp_path / "L"),
                                  str(tmp_path / "R"), "-o", str(out), "-n", "16", "--device", "cpu",
                                  "--scheduler", addr], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=env)
        deadline = time.time() + 120
        while time.time() < deadline and not (out.is_dir() and len(list(out.glob("*.png"))) >= 5):
            time.sleep(0.05)
        assert workers[0].poll() is None and len(list(out.glob("*.png"))) < 60  # killed mid-run
        workers[0].send_signal(signal.SIGKILL)
        try:
            _, err = batch.communicate(timeout=300)
        except subprocess.TimeoutExpired:  # hung: say where, with the stacks and the cluster's logs
            for proc in (batch, workers[1], procs[0]):  # the living worker's and the scheduler's too
                proc.send_signal(signal.SIGABRT)
            _, err = batch.communicate(timeout=60)
            workers[1].wait(timeout=60)
            procs[0].wait(timeout=60)
            tails = "".join(f"\n--- {name}\n" + path.read_text()[-12000:] for name, path in logs.items())
            pytest.fail(f"the batch hung after a worker was killed; {len(list(out.glob('*.png')))} outputs; "
                        f"its stderr:\n{err[-12000:]}{tails}")
        assert batch.returncode == 0, err
        assert "60 done, 0 failed" in err
        written = sorted(out.iterdir())
        assert len(written) == 60 and all(p.suffix == ".png" for p in written)  # no stray .part files
        first = written[0].read_bytes()
        assert all(p.read_bytes() == first for p in written)
    finally:
        for p in procs + ([batch] if batch is not None else []):
            p.kill()
            p.wait()
        for f in handles.values():
            f.close()


def test_scheduler_without_dask_says_what_to_install(tmp_path):
    code = ("import sys; sys.modules['distributed'] = None; from stereocli.cli import main; "
            f"sys.exit(main(['batch', {str(SAMPLE)!r}, {str(SAMPLE)!r}, '-o', {str(tmp_path / 'o')!r}, "
            "'--scheduler', 'local']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV)
    assert r.returncode == 2
    assert not (tmp_path / "o").exists()
    assert r.stderr.strip().splitlines() == [
        "stereo: error: --scheduler needs Dask: pip install 'stereocli[dask]' (or pip install 'dask[distributed]')"]


def test_fsspec_urls_in_a_pairs_list_on_the_cluster(tmp_path, crops):  # noqa: F811
    """Inputs and outputs given as fsspec URLs (file:// here; s3:// etc. the same way with
    their fsspec package): the workers read and write them themselves."""
    lines = []
    for i, (l_img, r_img) in enumerate(crops[:2]):
        cv2.imwrite(str(tmp_path / f"l{i}.png"), l_img)
        cv2.imwrite(str(tmp_path / f"r{i}.png"), r_img)
        lines.append(f"file://{tmp_path}/l{i}.png\tfile://{tmp_path}/r{i}.png")
    lines.append(f"file://{tmp_path}/missing.png\tfile://{tmp_path}/r0.png")
    (tmp_path / "pairs.tsv").write_text("\n".join(lines) + "\n")
    for where, extra in (("here", ()), ("there", ("--scheduler", "local", "--workers", 2))):
        r = stereo("batch", "--pairs", tmp_path / "pairs.tsv", "-o", f"file://{tmp_path}/{where}/maps",
                   "--format", "pfm", *N, *extra)
        assert r.returncode == 1, r.stderr
        assert "missing.png: no such file" in r.stderr and "2 done, 1 failed" in r.stderr
    assert files(tmp_path / "here/maps") == files(tmp_path / "there/maps")
    assert sorted(files(tmp_path / "there/maps")) == ["l0.pfm", "l1.pfm"]
