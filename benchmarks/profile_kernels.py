"""Runs census 9x7 + SGM + selection + LR check for one size a few times on
device-resident input, for a profiler to look at each kernel:

    ncu --metrics gpu__time_duration.sum,dram__bytes.sum --csv \\
        python benchmarks/profile_kernels.py 1920 1080 128 8 [ROUNDS]
"""
import sys

from gpu import kernel_times, pair

from stereocli.backends.cuda import CudaBackend

if __name__ == "__main__":
    w, h, n, paths = map(int, sys.argv[1:5])
    rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    left, right = pair(w, h)
    print(kernel_times(CudaBackend(), left, right, n, paths, rounds))
