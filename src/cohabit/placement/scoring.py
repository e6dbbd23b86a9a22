"""Scoring: which of the slots that fit wins. Binpack (default) keeps the fewest bytes left on
the chosen device, so whole cards stay free for large models; spread keeps the most. Ties go
to node order in the fleet, then the lowest device index (the slot's position).

Hardware partitions are always chosen smallest-that-fits, whatever the policy: a partition
holds one model, and a bigger one would strand its memory.
"""

from __future__ import annotations

from enum import StrEnum


class Policy(StrEnum):
    BINPACK = "binpack"
    SPREAD = "spread"


ScoreKey = tuple[int, int]


def score_key(policy: Policy, left_bytes: int, position: int) -> ScoreKey:
    """Sort key, smallest wins: bytes left after placement (negated for spread), then position.

    For a tensor-parallel choice `left_bytes` is the sum over its devices and `position` the
    node order.
    """
    return (left_bytes if policy is Policy.BINPACK else -left_bytes, position)
