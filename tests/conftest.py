import os
from pathlib import Path

# CUDA kernels run under Numba's simulator unless a real GPU is asked for
# (STEREOCLI_TEST_GPU=1, as on the device machine). Must be set before numba is imported.
if os.environ.get("STEREOCLI_TEST_GPU") != "1":
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
# Every `stereo` the tests start runs in-process; tests/test_worker.py turns the worker on.
os.environ["STEREOCLI_NO_WORKER"] = "1"

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_data"
SHARED_DATA = Path(os.environ.get("STEREOCLI_DATA", ROOT.parent / "shared" / "data"))


def textured_pair(h=20, w=32, shift=3, seed=0):
    """A random-texture pair where the right image is the left shifted by `shift` px
    (disparity = shift everywhere except the left border)."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=(h, w + shift + 8)).astype(np.float32)
    import cv2
    base = cv2.GaussianBlur(base, (3, 3), 0.8)
    left = base[:, 0:w].copy()
    right = base[:, shift:shift + w].copy()  # right(x - shift) == left(x)
    return left, right


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def pytest_report_header(config):
    return f"NUMBA_ENABLE_CUDASIM={os.environ.get('NUMBA_ENABLE_CUDASIM', '0')}"
