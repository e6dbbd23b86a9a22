"""What a model file from anywhere may make the estimator do: the one way the readers open
a file (a regular file only), bounds on the numbers a file may claim, and the one way
`shape.py` and `recurrent.py` read a number from config.json. A file must not make the
estimator block, raise an unexpected error, loop or allocate per claimed item.
"""

from __future__ import annotations

import math
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from cohabit.estimate.errors import ModelNotFound, UnsupportedModel

# Bounds on the numbers read from model files. Some formulas build one entry per layer, so the
# layer count is capped near real models (the deepest decoders have a few hundred layers); every
# other count, size or length only enters arithmetic and just has to be finite and whole.
MAX_LAYERS = 10_000
MAX_DIMENSION = 1 << 40
# No device holds an exbibyte; an estimate past it comes from numbers that are each in range
# but describe no real model, and would overflow the store's 64-bit byte columns.
MAX_ESTIMATE_BYTES = 1 << 60


def open_model_file(path: Path) -> BinaryIO:
    """`path` opened for reading when it is a regular file: a FIFO would block the reader (and
    the spawner's per-device lock with it) and a device such as /dev/zero never ends."""
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise UnsupportedModel(f"{path}: not a regular file")
        return path.open("rb")
    except FileNotFoundError:
        raise ModelNotFound(f"{path}: no such file") from None
    except OSError as err:
        raise ModelNotFound(f"{path}: cannot read ({err.strerror or err})") from None


def whole_number(value: Any, *, key: str, where: str, maximum: int = MAX_DIMENSION) -> int:
    """`value` (from a model file) as an int in 0..maximum. JSON numbers may be written as
    floats (1e6); NaN, infinities, fractions, booleans, strings and out-of-range values are an
    UnsupportedModel naming the key."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UnsupportedModel(f"{where}: {key} is {value!r}, expected a whole number")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise UnsupportedModel(f"{where}: {key} is {value!r}, expected a whole number")
    if not 0 <= value <= maximum:
        raise UnsupportedModel(f"{where}: {key} is {int(value):,}, outside 0..{maximum:,}")
    return int(value)


def opt_int(cfg: Mapping[str, Any], *keys: str) -> int | None:
    """The first of `keys` that holds a number, checked as `whole_number`; None when none does
    (absent, null, or a list or string where some configs keep a per-item value)."""
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return whole_number(value, key=key, where="config.json")
    return None


def ratio(value: Any, default: float) -> float:
    """A multiplier such as `mlp_ratio`: a finite positive number, else the default."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return float(value) if math.isfinite(value) and 0 < value <= 1024 else default
