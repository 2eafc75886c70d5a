"""Every benchmark runs (on a tiny input: --quick; gpu.py under Numba's CUDA simulator)
and prints JSON lines: a broken benchmark fails the build instead of waiting for the
next person who measures."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, SHARED_DATA

pytestmark = pytest.mark.skipif(not SHARED_DATA.exists(), reason="the benchmarks read ../shared/data")


# run under Numba's CUDA simulator
SIMULATED = ("gpu.py", "gpu_variants.py", "gpu_handoff.py", "sgm_sweep.py", "profile_kernels.py", "gpu_timeline.py")


@pytest.mark.parametrize("script,args", [
    ("accuracy.py", ["--quick"]),
    ("cpu_vs_opencv.py", ["--quick"]),
    ("pipeline_cost.py", ["--quick"]),
    ("batch.py", ["--quick"]),
    ("cluster.py", ["--quick"]),
    ("large_pair.py", ["--quick"]),
    ("startup.py", ["--quick"]),
    ("video.py", ["--quick"]),
    ("gpu.py", ["--sim-check"]),  # under Numba's CUDA simulator
    ("gpu_variants.py", ["--sim-check", "one-part:COST_PARTS=1,COST_PARTS_LARGE=1"]),  # (the same)
    ("gpu_handoff.py", ["--sim-check"]),  # (the same)
    ("sgm_sweep.py", ["--sim-check"]),  # (the same)
    ("profile_kernels.py", ["40", "16", "8", "4", "1"]),  # (the same)
    ("gpu_timeline.py", ["--sim-check"]),  # (the same)
    ("profile_host.py", ["--device", "cpu", "--scene", "tsukuba", "-n", "16", "--runs", "1"]),
    ("profile_cpu.py", ["--pairs", "tsukuba", "--threads", "1", "--repeat", "1"]),
    ("host_scaling.py", ["--quick", "--threads", "1,2"]),
])
def test_benchmark_runs_and_prints_json_lines(script, args):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    if script in SIMULATED:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True, text=True,
                       env={**env, "STEREOCLI_DATA": str(SHARED_DATA)}, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    if script == "profile_kernels.py":  # prints the kernel times as a dict, for a profiler's run
        assert "aggregate" in r.stdout
        return
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    assert rows and all(isinstance(row, dict) for row in rows)
    if script == "startup.py":  # processes after the first find every kernel in the cache
        assert [row["compiled_during_timed_runs"] for row in rows if row["bench"] == "kernel cache"] == [0]
