"""Estimator test helpers: configs stored under tests/fixtures/estimate/configs/."""

from __future__ import annotations

from pathlib import Path

from cohabit.estimate.checkpoint import load_shape
from cohabit.estimate.shape import ModelShape

CONFIGS = Path(__file__).parents[1] / "fixtures" / "estimate" / "configs"


def config_path(name: str) -> Path:
    return CONFIGS / f"{name}.json"


def shape_of(name: str) -> ModelShape:
    return load_shape(config_path(name))
