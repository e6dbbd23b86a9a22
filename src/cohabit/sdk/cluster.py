"""`client.cluster`: the hardware a server places on — every node, its GPUs, partitions and
pools, and the budget reserved and free on each. `AsyncClusterService` is the same, awaited."""

from __future__ import annotations

from cohabit.sdk import calls
from cohabit.sdk.http import AsyncHttpSession, HttpSession
from cohabit.sdk.schemas import HardwareNode


class ClusterService:
    def __init__(self, http: HttpSession) -> None:
        self._http = http

    def hardware(self) -> list[HardwareNode]:
        """`GET /cluster/hardware`: nodes with their slots' capacity, reserved and free bytes."""
        return self._http.run(calls.cluster_hardware())


class AsyncClusterService:
    def __init__(self, http: AsyncHttpSession) -> None:
        self._http = http

    async def hardware(self) -> list[HardwareNode]:
        return await self._http.run(calls.cluster_hardware())
