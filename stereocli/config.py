"""Matching parameters, presets (TOML files in configs/) and their validation.

A preset is a flat TOML table whose keys are the fields of `Params`. Values are
applied in order: built-in defaults, then the preset, then a --config file, then
explicit options. `Params.validate()` checks every value and raises StereoError
with a message that names the option and the allowed values.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import sys
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from .errors import StereoError

PREPROCESS = ("none", "dog", "bilateral")
COSTS = ("census", "sad", "ssd", "zsad", "zssd", "zncc", "bt", "mi")
ZERO_MEAN_COSTS = {"zsad": "sad", "zssd": "ssd", "zncc": "sad"}  # (the per-pixel cost that one pixel's window leaves)
AGGREGATIONS = ("sgm", "mgm", "none")
MGM_PATHS = (4, 8)  # More Global Matching's passes: the four quadrants, or those and the four cones
PATHS = (4, 8, 16)
FILLS = ("none", "background", "nearest", "slope", "2d")
DEVICES = ("auto", "cpu", "cuda")

# Window used by each cost when none is given (width, height).
DEFAULT_WINDOW = {
    "census": (9, 7), "sad": (5, 5), "ssd": (5, 5), "zsad": (5, 5), "zssd": (5, 5),
    "zncc": (7, 7), "bt": (3, 3), "mi": (1, 1),
}
CENSUS_MAX_BITS = 63  # the comparison string of a census window must fit a uint64
WMF_MAX_RADIUS = 12  # the weighted median's largest window radius (its samples are kept on the stack)


def max_p2(paths: int) -> int:
    """The largest P2 for `paths` directions: each path's costs stay below 255 + P2, and
    their sum over all paths must fit uint16."""
    return 65535 // paths - 256


@dataclass
class Params:
    """Everything that decides the result of a match (the device does not)."""
    num_disparities: int = 64
    min_disparity: int = 0
    # preprocessing
    preprocess: str = "none"
    dog_sigma1: float = 0.7
    dog_sigma2: float = 2.5
    bilateral_radius: int = 3
    bilateral_sigma_space: float = 2.0
    bilateral_sigma_color: float = 12.0
    # matching cost; every cost is scaled to 0..255 "cost units"
    cost: str = "census"
    window: tuple | None = None  # (width, height); None = the cost's default
    mi_levels: int = 3  # coarse-to-fine levels for mutual information
    # aggregation
    aggregation: str = "sgm"
    block: int = 1  # box aggregation of the cost volume (odd size, 1 = off)
    paths: int = 8
    p1: int = 40
    p2: int = 480
    adaptive_p2: bool = True
    # selection
    uniqueness: float = 5.0  # percent margin the best cost must win by
    subpixel: bool = True
    # refinement
    lr_check: bool = True
    lr_max_diff: float = 1.0
    speckle_size: int = 100
    speckle_diff: float = 2.0
    fill: str = "background"
    median: int = 3
    # edge-aware weighted median at disparity edges (refine.weighted_median_at): radius, 0 = off
    weighted_median: int = 0
    # pixels whose confidence (select.margin_confidence, 0 where rejected or filled) is
    # below this are invalid in the output; 0 = keep all
    min_confidence: float = 0.0
    # memory budget for one strip's volumes in MiB (0 = automatic)
    max_memory: int = 0

    @property
    def max_disparity(self) -> int:
        """The largest disparity searched (the range is min_disparity..max_disparity)."""
        return self.min_disparity + self.num_disparities - 1

    def window_size(self) -> tuple[int, int]:
        return tuple(self.window) if self.window else DEFAULT_WINDOW[self.cost]

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["window"] = list(self.window_size())
        return d

    def validate(self) -> "Params":
        def need(cond, msg):
            if not cond:
                raise StereoError(msg)

        def choice(name, value, allowed):
            need(value in allowed, f"{name} must be one of {', '.join(map(str, allowed))}, not {value!r}")

        need(isinstance(self.num_disparities, int) and self.num_disparities >= 1,
             f"--num-disparities must be a positive integer, not {self.num_disparities!r}")
        need(isinstance(self.min_disparity, int), f"--min-disparity must be an integer, not {self.min_disparity!r}")
        choice("--preprocess", self.preprocess, PREPROCESS)
        choice("--cost", self.cost, COSTS)
        choice("--aggregation", self.aggregation, AGGREGATIONS)
        choice("--paths", self.paths, PATHS)
        need(self.aggregation != "mgm" or self.paths in MGM_PATHS,
             f"--aggregation mgm takes --paths 4 or 8, not {self.paths}; use 8, or sgm for 16 paths")
        choice("--fill", self.fill, FILLS)
        need(0 < self.dog_sigma1 < self.dog_sigma2,
             f"DoG sigmas must satisfy 0 < dog_sigma1 < dog_sigma2 (got {self.dog_sigma1}, {self.dog_sigma2})")
        need(self.bilateral_radius >= 1 and self.bilateral_sigma_space > 0 and self.bilateral_sigma_color > 0,
             "bilateral_radius must be >= 1 and the bilateral sigmas > 0")
        wx, wy = self.window_size()
        need(wx >= 1 and wy >= 1 and wx % 2 == 1 and wy % 2 == 1,
             f"--window must be odd and positive, e.g. 9x7 or 5, not {wx}x{wy}")
        need(wx * wy > 1 or self.cost not in ZERO_MEAN_COSTS,
             f"--cost {self.cost} takes each window's mean out, so over a 1x1 window every cost is the same; "
             f"use a window of 3x3 or more (e.g. --window 7x7), or --cost {ZERO_MEAN_COSTS.get(self.cost)}")
        if self.cost == "census":
            need(wx * wy - 1 <= CENSUS_MAX_BITS and wx * wy > 1,
                 f"a census window of {wx}x{wy} has {wx * wy - 1} comparisons; at most {CENSUS_MAX_BITS} fit "
                 f"(e.g. 9x7, 7x7, 5x5)")
        need(wx <= 31 and wy <= 31, f"--window {wx}x{wy} is too large; use at most 31x31")
        need(1 <= self.mi_levels <= 6, f"mi_levels must be 1..6, not {self.mi_levels}")
        need(isinstance(self.block, int) and self.block >= 1 and self.block % 2 == 1 and self.block <= 31,
             f"--block must be an odd size from 1 to 31, not {self.block!r}")
        need(isinstance(self.p1, int) and isinstance(self.p2, int) and 0 <= self.p1 <= self.p2,
             f"--p1 and --p2 must be integers with 0 <= P1 <= P2 (got {self.p1}, {self.p2})")
        largest = max_p2(self.paths)
        need(self.p2 <= largest, f"--p2 {self.p2} is too large for {self.paths} paths; use at most {largest}")
        need(0 <= self.uniqueness < 100, f"--uniqueness must be a percentage in [0, 100), not {self.uniqueness}")
        need(self.lr_max_diff >= 0, f"--lr-max-diff must be >= 0, not {self.lr_max_diff}")
        need(self.speckle_size >= 0 and self.speckle_diff >= 0, "speckle size and difference must be >= 0")
        need(self.median in (0, 1, 3, 5), f"--median must be 0 (off), 3 or 5, not {self.median}")
        need(isinstance(self.weighted_median, int) and 0 <= self.weighted_median <= WMF_MAX_RADIUS,
             f"--weighted-median must be a radius from 0 (off) to {WMF_MAX_RADIUS}, not {self.weighted_median!r}")
        need(0.0 <= self.min_confidence <= 1.0,
             f"--min-confidence must be in [0, 1], not {self.min_confidence}")
        need(self.max_memory >= 0, f"--max-memory must be >= 0 MiB, not {self.max_memory}")
        return self


FIELD_TYPES = {f.name: f.type for f in fields(Params)}


def parse_window(text) -> tuple[int, int]:
    """'9x7' -> (9, 7); '5' -> (5, 5)."""
    if isinstance(text, (list, tuple)):
        if len(text) != 2:
            raise StereoError(f"window must have two sizes (width, height), not {text!r}")
        return int(text[0]), int(text[1])
    if isinstance(text, int):
        return text, text
    try:
        parts = [int(p) for p in str(text).lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2:
        raise StereoError(f"--window must look like 9x7 or 5, not {text!r}")
    return parts[0], parts[1]


def _coerce(name: str, value):
    default = getattr(Params, name, None)
    if name == "window":
        return None if value in (None, "", "auto") else parse_window(value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise StereoError(f"{name} must be true or false, not {value!r}")
        return value
    if isinstance(default, int) and not isinstance(value, bool):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise StereoError(f"{name} must be an integer, not {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise StereoError(f"{name} must be a number, not {value!r}")
        return float(value)
    if isinstance(default, str):
        return str(value)
    return value


def apply(params: Params, values: dict, source: str) -> Params:
    """Return params with `values` applied; unknown keys are an error naming `source`."""
    changes = {}
    for key, value in values.items():
        name = key.replace("-", "_")
        if name not in FIELD_TYPES:
            raise StereoError(f"{source}: unknown setting {key!r}; known settings: {', '.join(FIELD_TYPES)}")
        changes[name] = _coerce(name, value)
    return dataclasses.replace(params, **changes)


@functools.lru_cache(maxsize=32)
def _preset_params(name: str, stamp) -> Params:
    """A preset over the defaults, parsed once per version of its file (`stamp`): a
    match through stereocli.match loads its preset every call, and reading and parsing
    it took 0.25-0.5 ms on the H100 machine's host, a fifth of a small GPU match."""
    return apply(Params(), _load_toml(preset_text(name), f"preset {name}"), f"preset {name}")


def _preset_stamp(name: str):
    """(mtime, size) of a preset's file, so that an edited preset is read again; None
    where it cannot be told (presets inside a zip)."""
    try:
        st = os.stat(str(presets_dir() / f"{name}.toml"))
        return st.st_mtime_ns, st.st_size
    except (OSError, TypeError):
        return None


@functools.lru_cache(maxsize=1)
def presets_dir():
    """The presets: configs/ of the repository, installed as the package data `stereocli.configs`."""
    try:
        return resources.files("stereocli.configs")
    except ModuleNotFoundError:  # running from a source tree (PYTHONPATH=.)
        return Path(__file__).resolve().parent.parent / "configs"


def preset_names() -> list[str]:
    return sorted(p.name[:-5] for p in presets_dir().iterdir() if p.name.endswith(".toml"))


def preset_text(name: str) -> str:
    f = presets_dir() / f"{name}.toml"
    if not f.is_file():
        raise StereoError(f"unknown preset {name!r}; available presets: {', '.join(preset_names())} "
                          f"(or pass your own file with --config FILE.toml)")
    return f.read_text()


def _load_toml(text: str, source: str) -> dict:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise StereoError(f"{source} is not valid TOML: {e}") from None
    data.pop("description", None)
    return data


def preset_description(name: str) -> str:
    return tomllib.loads(preset_text(name)).get("description", "")


def load(preset: str = "default", config_file: str | Path | None = None, overrides: dict | None = None) -> Params:
    """Defaults <- preset <- config file <- overrides, validated."""
    params = dataclasses.replace(_preset_params(preset, _preset_stamp(preset)))
    if config_file is not None:
        path = Path(config_file)
        try:
            text = path.read_text()
        except OSError as e:
            raise StereoError(f"cannot read config file {path}: {e.strerror}") from None
        params = apply(params, _load_toml(text, str(path)), str(path))
    if overrides:
        params = apply(params, {k: v for k, v in overrides.items() if v is not None}, "option")
    return params.validate()
