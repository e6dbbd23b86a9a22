"""Faults of the placement layer (not outcomes: "does not fit" is a `NoFit` value).

PlacementError(ValueError)
 └── InvalidRequest     a request that can never be planned as written (size ≤ 0, TP < 1,
                        unknown vendor or engine); the message names the request and field
"""

from __future__ import annotations


class PlacementError(ValueError):
    """Base of the placement layer's faults."""


class InvalidRequest(PlacementError):
    """A placement request that is wrong as written."""
