"""GPU kernel totals under variants of the CUDA backend's tuning constants, alternated
in one process: the A/B measurement behind most of docs/speed.md's GPU figures. Each
round runs every variant once per configuration (gpu.py's kernel_times: census 9x7 +
SGM + WTA + LR check on device-resident input, best of --repeat, the stream held while
Python launches), so that variants meet the same clocks and the same machine start.
One JSON line per configuration, round and variant.

    python benchmarks/gpu_variants.py --configs 3840x2160/256/8 --rounds 2 \\
        rows64:BAND_ROWS_LARGE=64 rows32:BAND_ROWS_LARGE=32

A variant is NAME:SETTING,SETTING,... (NAME: alone is the code as it is); a SETTING is
CONSTANT=VALUE, a module constant of stereocli/backends/cuda's aggregate_bands, cost,
aggregate or select (the first that has it), converted to that constant's type (1 or 0
for a boolean). The kernels are compiled per key, so settings that change a kernel's
shape get their own; settings read only at import (the environment variables) cannot
be varied here.
"""
import argparse

import numba

from common import emit
from gpu import kernel_times, pair


def parse_variant(text, modules):
    """(name, {(module, constant): value}) from NAME:CONSTANT=VALUE,..."""
    name, _, settings = text.partition(":")
    out = {}
    for item in filter(None, settings.split(",")):
        key, _, value = item.partition("=")
        module = next((m for m in modules if hasattr(m, key)), None)
        if module is None:
            raise ValueError(f"no constant {key} in {', '.join(m.__name__ for m in modules)}")
        old = getattr(module, key)
        out[module, key] = value == "1" if isinstance(old, bool) else type(old)(value)
    return name or text, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("variants", nargs="*", default=["as-is:"], help="NAME:CONSTANT=VALUE,... [as-is:]")
    ap.add_argument("--configs", default="1920x1080/128/4", help="WxH/D/PATHS[,...] [1920x1080/128/4]")
    ap.add_argument("--rounds", type=int, default=2, help="rounds over every variant [2]")
    ap.add_argument("--repeat", type=int, default=10, help="kernel runs per measurement, the best kept [10]")
    ap.add_argument("--sim-check", action="store_true",
                    help="one tiny size and round, for NUMBA_ENABLE_CUDASIM=1 in CI (a check that the script runs)")
    a = ap.parse_args()
    from stereocli.backends.cuda import CudaBackend
    from stereocli.backends.cuda import aggregate, aggregate_bands, cost, select
    modules = (aggregate_bands, cost, aggregate, select)
    try:
        variants = [parse_variant(v, modules) for v in a.variants]
    except ValueError as e:
        ap.error(str(e))
    defaults = {key: getattr(*key) for _, settings in variants for key in settings}
    configs = [tuple(int(v) for v in c.replace("x", "/").split("/")) for c in a.configs.split(",")]
    if a.sim_check:
        configs, a.rounds, a.repeat = [(40, 16, 8, 4)], 1, 1
    bk = CudaBackend()
    for w, h, ndisp, paths in configs:
        left, right = pair(w, h)
        for r in range(a.rounds):
            for name, settings in variants:
                for (module, key), value in {**defaults, **settings}.items():
                    setattr(module, key, value)
                k = kernel_times(bk, left, right, ndisp, paths, a.repeat)
                emit(width=w, height=h, num_disparities=ndisp, paths=paths, round=r, variant=name,
                     settings={key: value for (_, key), value in settings.items()},
                     kernel_ms={s: round(v, 3) for s, v in k.items()},
                     simulator=bool(numba.config.ENABLE_CUDASIM))
        for (module, key), value in defaults.items():
            setattr(module, key, value)


if __name__ == "__main__":
    main()
