"""Why a request did not fit: the reason enum, per-device `Reason` records, and `NoFit`,
the value the planner returns. The one place placement messages are written.

A `NoFit` reads like the kube-scheduler's FitError: "0/3 nodes fit: 2 insufficient GPU memory
(largest free 4 GiB on node-a gpu 0), 1 vendor mismatch". When unloading other copies was
considered and could not help, its `PreemptionNote` says why after that sentence.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from cohabit.units import format_gib


class NoFitReason(StrEnum):
    """The request-level reason, chosen in this order of precedence (docs/placement.md)."""

    VENDOR_MISMATCH = "vendor_mismatch"
    ACCEL_VERSION_UNMET = "accel_version_unmet"
    INSUFFICIENT_GPU_COUNT = "insufficient_gpu_count"
    SHARING_NOT_CONFIGURED = "sharing_not_configured"
    INSUFFICIENT_SYSTEM_MEMORY = "insufficient_system_memory"
    INSUFFICIENT_CAPACITY = "insufficient_capacity"


HINTS: Mapping[NoFitReason, str] = {
    NoFitReason.VENDOR_MISMATCH: ("pick a model or engine variant that matches the GPUs you have"),
    NoFitReason.ACCEL_VERSION_UNMET: (
        "upgrade the GPU driver, or choose a variant built for your driver generation"
    ),
    NoFitReason.INSUFFICIENT_GPU_COUNT: (
        "lower the tensor-parallel size, or free GPUs on a multi-GPU node"
    ),
    NoFitReason.SHARING_NOT_CONFIGURED: (
        "ask the cluster admin to enable GPU sharing (time-slicing, MPS or MIG), or free a GPU"
    ),
    NoFitReason.INSUFFICIENT_SYSTEM_MEMORY: (
        "stop another deployment on the shared memory pool, or pick a smaller model"
    ),
    NoFitReason.INSUFFICIENT_CAPACITY: (
        "pick a smaller or more quantized variant, reduce the context length, "
        "or stop an unused deployment"
    ),
}


class FilterCode(StrEnum):
    """Why one device (or one node) was passed over; filters return these in `Reason`s."""

    VENDOR_MISMATCH = "vendor mismatch"
    ACCEL_VERSION_UNMET = "accelerator version unmet"
    UNSCHEDULABLE = "not schedulable"
    NOT_SPLITTABLE = "cannot hold a tensor-parallel shard"
    DEVICE_TAKEN = "device taken whole"
    INSUFFICIENT_GPU_COUNT = "insufficient GPU count"
    SHARING_NOT_CONFIGURED = "sharing not configured"
    INSUFFICIENT_GPU_MEMORY = "insufficient GPU memory"
    INSUFFICIENT_SYSTEM_MEMORY = "insufficient system memory"


CAPACITY_CODES = frozenset(
    {
        FilterCode.INSUFFICIENT_GPU_MEMORY,
        FilterCode.INSUFFICIENT_SYSTEM_MEMORY,
        FilterCode.DEVICE_TAKEN,
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Reason:
    """One device that a filter turned down, with the numbers behind it."""

    code: FilterCode
    location: str
    requested_bytes: int = 0
    free_bytes: int = 0
    capacity_bytes: int = 0
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class NoFit:
    """A request that fits nowhere, and the structured story of why.

    `node_reasons` counts nodes by the first filter that turned each down;
    `candidates_filtered` counts devices (GPUs, partitions, pools) the same way.
    `foreign_bytes` is memory that processes outside cohabit hold on `foreign_location`, a
    device the request could have used, where it cut the free budget (0 and None: nowhere).
    `unschedulable` counts the nodes counted as not schedulable by why ("cordoned"), where
    the caller knows it (empty: the sentence gives only their number).
    """

    name: str
    reason: NoFitReason
    requested_bytes: int
    tensor_parallel: int
    largest_free_bytes: int
    largest_free_location: str | None
    nodes_considered: int
    node_reasons: Mapping[str, int]
    candidates_considered: int
    candidates_filtered: Mapping[str, int]
    foreign_bytes: int = 0
    foreign_location: str | None = None
    unschedulable: Mapping[str, int] = field(default_factory=dict)

    preemption: PreemptionNote | None = None

    placed = False

    @property
    def message(self) -> str:
        """The one-line sentence: "0/N nodes fit: …", then why preemption could not help
        when it was considered."""
        sentence = no_fit_sentence(
            nodes_considered=self.nodes_considered,
            node_reasons=self.node_reasons,
            largest_free_bytes=self.largest_free_bytes,
            largest_free_location=self.largest_free_location,
            unschedulable=self.unschedulable,
        )
        if self.preemption is not None:
            sentence += f"; {self.preemption.sentence()}"
        if self.foreign_location is None:
            return sentence
        held = format_gib(self.foreign_bytes)
        return f"{sentence}; {held} held by processes outside cohabit on {self.foreign_location}"

    @property
    def hint(self) -> str:
        """What a user can do about it (the fix the docs give for the reason)."""
        return HINTS[self.reason]

    def details(self) -> dict[str, Any]:
        """The structured body shared by the CLI, the API and the deployment record."""
        return {
            "requested_bytes": self.requested_bytes,
            "tensor_parallel": self.tensor_parallel,
            "largest_free_bytes": self.largest_free_bytes,
            "largest_free_location": self.largest_free_location,
            "nodes_considered": self.nodes_considered,
            "node_reasons": dict(self.node_reasons),
            "candidates_considered": self.candidates_considered,
            "candidates_filtered": dict(self.candidates_filtered),
            "foreign_bytes": self.foreign_bytes,
            "foreign_location": self.foreign_location,
            "hint": self.hint,
            # Only when preemption was considered, so plain refusals keep their shape.
            **({} if self.preemption is None else {"preemption": self.preemption.details()}),
        }


class PreemptionBlock(StrEnum):
    """Why unloading other copies could not make a request fit."""

    NEVER_FITS = "never_fits"  # it fits nowhere even with nothing reserved
    NO_CANDIDATES = "no_candidates"  # no idle copy it may unload holds budget where it could go
    NOT_ENOUGH = "not_enough"  # unloading every copy it may unload would not free enough


@dataclass(frozen=True, slots=True, kw_only=True)
class PreemptionNote:
    """What preemption found, for a request it could not place.

    Copies are counted when they hold budget on a device the request may use (vendor,
    version and class filters pass): `idle_copies` it could unload; `busy_copies` it could
    but for requests in flight; `higher_priority_copies`; `kept_copies` of equal priority
    whose deployments keep their copies (min_copies above 0); `other_holders`, deployments
    holding budget there that are not running copies (still starting). `largest_free_bytes`
    is the largest free budget with every idle copy unloaded.
    """

    block: PreemptionBlock
    priority: int
    requested_bytes: int
    idle_copies: int = 0
    busy_copies: int = 0
    higher_priority_copies: int = 0
    kept_copies: int = 0
    other_holders: int = 0
    largest_free_bytes: int = 0
    largest_free_location: str | None = None

    def sentence(self) -> str:
        """ "preemption cannot help: unloading the 2 idle copies it may unload would leave
        at most 4 GiB free on node-a gpu 0 (8 GiB needed); 1 busy, 3 of higher priority" """
        if self.block is PreemptionBlock.NEVER_FITS:
            return "preemption cannot help: it does not fit even with nothing reserved"
        if self.block is PreemptionBlock.NO_CANDIDATES:
            head = (
                "preemption cannot help: no idle copy it may unload (priority below "
                f"{self.priority}, or {self.priority} with min_copies 0) holds budget "
                "where it could go"
            )
        else:
            where = f" on {self.largest_free_location}" if self.largest_free_location else ""
            copies = "copy" if self.idle_copies == 1 else "copies"
            head = (
                f"preemption cannot help: unloading the {self.idle_copies} idle {copies} "
                f"it may unload would leave at most {format_gib(self.largest_free_bytes)} "
                f"free{where} ({format_gib(self.requested_bytes)} needed)"
            )
        others = [
            f"{count} {label}"
            for count, label in (
                (self.busy_copies, "busy"),
                (self.higher_priority_copies, "of higher priority"),
                (
                    self.kept_copies,
                    f"of priority {self.priority} keeping its copies (min_copies above 0)",
                ),
                (self.other_holders, "still starting"),
            )
            if count
        ]
        return head + (f"; {', '.join(others)}" if others else "")

    def details(self) -> dict[str, Any]:
        return {
            "block": self.block.value,
            "message": self.sentence(),
            "priority": self.priority,
            "idle_copies": self.idle_copies,
            "busy_copies": self.busy_copies,
            "higher_priority_copies": self.higher_priority_copies,
            "kept_copies": self.kept_copies,
            "other_holders": self.other_holders,
            "largest_free_bytes": self.largest_free_bytes,
            "largest_free_location": self.largest_free_location,
        }


def no_fit_sentence(
    *,
    nodes_considered: int,
    node_reasons: Mapping[str, int],
    largest_free_bytes: int,
    largest_free_location: str | None,
    unschedulable: Mapping[str, int] | None = None,
) -> str:
    """ "0/3 nodes fit: 2 insufficient GPU memory (largest free 4 GiB on node-a gpu 0), 1 vendor
    mismatch" — counts largest first; the largest free budget follows the first memory reason.
    Why nodes are not schedulable follows their count: "1 not schedulable: cordoned" when
    they share one reason, "3 not schedulable (2 cordoned, 1 not ready)" when not.
    """
    parts: list[str] = []
    told_free = False
    for code, count in _largest_first(node_reasons):
        part = f"{count} {code}"
        if code == FilterCode.UNSCHEDULABLE and unschedulable:
            part += _why_unschedulable(unschedulable)
        if not told_free and code in CAPACITY_CODES | {FilterCode.INSUFFICIENT_GPU_COUNT}:
            if largest_free_location is not None:
                part += (
                    f" (largest free {format_gib(largest_free_bytes)} on {largest_free_location})"
                )
            told_free = True
        parts.append(part)
    summary = ", ".join(parts) if parts else "no nodes"
    return f"0/{nodes_considered} nodes fit: {summary}"


def _largest_first(counts: Mapping[str, int]) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def _why_unschedulable(unschedulable: Mapping[str, int]) -> str:
    """ ": cordoned", or " (2 cordoned, 1 not ready)" when the reasons differ."""
    if len(unschedulable) == 1:
        (why,) = unschedulable
        return f": {why}"
    return f" ({', '.join(f'{count} {why}' for why, count in _largest_first(unschedulable))})"
