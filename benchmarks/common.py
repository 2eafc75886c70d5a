"""Helpers shared by the benchmark scripts."""
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("STEREOCLI_DATA", ROOT.parent / "shared" / "data"))
SCENES = [("tsukuba", 16), ("venus", 32), ("teddy", 64), ("cones", 64)]
OPENCV_README_BAD2 = {"tsukuba": 6.0, "venus": 9.3, "teddy": 24.4, "cones": 21.7}


def emit(**row):
    print(json.dumps(row), flush=True)


def best_ms(fn, repeat=5):
    fn()  # warm (compile / caches)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return min(times)


def data_dir(argv):
    return Path(argv[1]) if len(argv) > 1 else DATA


if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
