"""Every CPU benchmark runs (on a tiny input, --quick) and prints JSON lines: a broken
benchmark fails the build instead of waiting for the next person who measures. The GPU
ones (gpu.py, profile_kernels.py) need a real GPU and run on the device machine."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, SHARED_DATA

pytestmark = pytest.mark.skipif(not SHARED_DATA.exists(), reason="the benchmarks read ../shared/data")


@pytest.mark.parametrize("script,args", [
    ("accuracy.py", ["--quick"]),
    ("cpu_vs_opencv.py", ["--quick"]),
    ("batch.py", ["--quick"]),
    ("cluster.py", ["--quick"]),
    ("large_pair.py", ["--quick"]),
    ("startup.py", ["--quick"]),
])
def test_benchmark_runs_and_prints_json_lines(script, args):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True, text=True,
                       env={**env, "STEREOCLI_DATA": str(SHARED_DATA)}, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    assert rows and all(isinstance(row, dict) for row in rows)
