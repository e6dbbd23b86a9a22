"""Faults the estimator raises; callers (CLI, service) turn them into one line for a person.

    ValueError
    └── EstimateError            anything the estimator cannot answer
        ├── ModelNotFound        no config.json / .gguf / repo at that source
        ├── UnsupportedModel     the files lack a number the formulas need, or name an
        │                        architecture or quantization we do not model
        └── InvalidSetting       a setting that the engine would refuse (tp that does not
                                 divide the heads, a negative length, an unknown dtype)

A budget that is too small is not a fault: `budget.py` returns a `BudgetShortfall` value.
"""

from __future__ import annotations


class EstimateError(ValueError):
    """The estimator cannot answer; the message says what and where."""


class ModelNotFound(EstimateError):
    """No model at the given path or repo id."""


class UnsupportedModel(EstimateError):
    """The model's files miss a needed number or use something we do not model."""


class InvalidSetting(EstimateError):
    """A setting the engine would refuse for this model."""
