"""Nodes ⇄ JSON for the `nodes` table: every field of `hardware.model.Node`, so that the fleet
the planner sees after a restart (or in another process) is the one that was saved."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from cohabit.hardware.model import (
    Gpu,
    GpuProcess,
    Node,
    Notice,
    NoticeCode,
    Partition,
    SharingStrategy,
    Vendor,
)


def node_to_json(node: Node) -> dict[str, Any]:
    """Enums are StrEnums, so the dataclass dump is already JSON."""
    return asdict(node)


def node_from_json(data: dict[str, Any]) -> Node:
    gpus = tuple(
        Gpu(
            **{
                **gpu,
                "vendor": Vendor(gpu["vendor"]),
                "partitions": tuple(Partition(**part) for part in gpu.get("partitions", ())),
                "processes": tuple(GpuProcess(**proc) for proc in gpu.get("processes", ())),
            }
        )
        for gpu in data.get("gpus", ())
    )
    strategy = data.get("sharing_strategy")
    return Node(
        **{
            **data,
            "gpus": gpus,
            "sharing_strategy": None if strategy is None else SharingStrategy(strategy),
            "notices": tuple(
                Notice(code=NoticeCode(item["code"]), message=item["message"])
                for item in data.get("notices", ())
            ),
        }
    )
