"""The warm tier, for the reconciler: an idle vLLM copy sleeps instead of unloading, and a
request wakes it in about a second instead of a full load. Other engines unload as before.

Each copy decides alone: its engine is its own vLLM process, holding its own budget. Sleeping
keeps the engine's process; its reservation shrinks to the residue vLLM keeps on the card
(store/residency.py) — the estimate's, then the meter's figure once it has measured the
engine asleep — at level 1 when the node's host memory can take the weights, else level 2.
A request for it reaches the reconciler as a load (`Reconciler.load`), which takes the
budget back and wakes the engine (runtime/sleep.py); when the budget does not fit, room is
made as for a placement (service/control/room.py); one that does not wake is started again
inside its budget.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING

from cohabit.estimate.engines import CUDA_CONTEXT_BYTES, VLLM_NON_TORCH_BYTES
from cohabit.estimate.estimate import Estimate
from cohabit.hardware.model import HardwareClass, Vendor
from cohabit.placement.residency import SleepLevel
from cohabit.runtime.errors import SleepError
from cohabit.runtime.interface import handle_from_json
from cohabit.runtime.sleep import SleepClient
from cohabit.service.control import timeline
from cohabit.store import copyset, deployments, residency
from cohabit.store.database import Database, utcnow
from cohabit.store.errors import RecordNotFound
from cohabit.store.events import EventKind
from cohabit.store.records import DeploymentRecord, DeploymentStatus
from cohabit.store.residency import MeasuredResidue

if TYPE_CHECKING:
    from cohabit.service.control.driver import Driver

# Makes room for a sleeping copy's budget (`RoomMaker.make_room_to_wake`): what it did, for
# the `woke` event, or None when nothing makes room.
MakeRoom = Callable[[DeploymentRecord], str | None]

log = logging.getLogger(__name__)


def sleeps_when_idle(record: DeploymentRecord, *, enabled: bool) -> bool:
    """Whether this deployment's engines — every copy's — are started able to sleep: the
    tier is on, the deployment scales to zero (only then is an idle copy put away), and it
    runs on vLLM on an NVIDIA GPU (runtime/engines/vllm.py `can_sleep` decides the flags
    from the same)."""
    placement = record.placement
    on_nvidia = placement is None or (
        placement.gpu_vendor == Vendor.NVIDIA.value
        and placement.hardware_class != HardwareClass.CPU.value
    )
    return enabled and record.engine == "vllm" and record.scaling.scales_to_zero and on_nvidia


def weights_bytes(record: DeploymentRecord) -> int:
    """The weights level 1 parks in host memory: the estimate's per-GPU weights times the
    GPUs (0 when unknown: level 2 then). Llama-3.1-8B bf16 on one GPU: 16,060,522,496."""
    if record.estimate is None:
        return 0
    estimate = Estimate.from_dict(record.estimate)
    return estimate.weights_bytes * max(1, estimate.tensor_parallel)


def residue_bytes(record: DeploymentRecord) -> int:
    """What a sleeping vLLM still holds on each GPU: its overhead outside the weights and the
    KV cache — the CUDA context, CUDA graphs and library workspaces, which the CuMem
    allocator's sleep does not hand back (vllm/device_allocator/cumem.py pools only the
    `weights` and `kv_cache` tags). The estimate's overhead when there is one, else the
    context and workspaces alone (672 MiB). Llama-3.1-8B at 16,000 tokens on one GPU, CUDA
    graphs on: 512 MiB context + 160 MiB workspaces + 156 MiB graphs = 868,220,928 bytes."""
    if record.estimate is None:
        return CUDA_CONTEXT_BYTES + VLLM_NON_TORCH_BYTES
    return Estimate.from_dict(record.estimate).overhead_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class WakeOutcome:
    """What `Warm.wake` did: `on_its_way` (woke, or started again), else `why` not."""

    on_its_way: bool
    why: str = ""


class Warm:
    """One reconciler's warm tier (see the module docstring). `enabled` False: every idle
    copy unloads, as before the tier. `make_room` makes room for a wake that does not fit
    (the reconciler's room maker's, set once both exist)."""

    def __init__(self, reconciler: Driver, *, enabled: bool) -> None:
        self.reconciler = reconciler
        self.enabled = enabled
        self.make_room: MakeRoom | None = None
        # Copies this process put to sleep whose residue the meter has not measured yet,
        # with when the sleep was settled: a sample taken after that one measures it asleep.
        self._unmeasured: dict[str, datetime] = {}

    def can_sleep(self, record: DeploymentRecord) -> bool:
        """Whether `sleep` may put this copy to sleep now: a sleeper (see
        `sleeps_when_idle`), awake, with an engine serving. Any copy may: each has its own
        engine and budget."""
        return (
            sleeps_when_idle(record, enabled=self.enabled)
            and record.sleep_level is None
            and _client(record) is not None
        )

    def sleep(self, record: DeploymentRecord, *, reason: str) -> bool:
        """Put an idle copy's engine to sleep; False when it cannot (not a sleeper, no
        engine, or the engine refused): the caller unloads or stops it."""
        if record.sleep_level is not None and sleeps_when_idle(record, enabled=self.enabled):
            return True  # asleep already
        client = _client(record)
        if not self.can_sleep(record) or client is None:
            return False
        db = self.reconciler.db
        level = residency.begin_sleep(db, record.id, weights_bytes=weights_bytes(record))
        if level is None:
            return False
        try:
            client.sleep(level)
        except SleepError as err:
            log.warning("deployment %s did not go to sleep: %s", record.id, err)
            residency.awake(db, record.id)
            return False
        residue = residue_bytes(record)
        residency.settle_sleep(db, record.id, residue_bytes=residue)
        self._unmeasured[record.id] = utcnow()
        kept = "its weights in host memory" if level is SleepLevel.OFFLOAD else "no weights"
        timeline.note(
            db,
            record.id,
            EventKind.SLEPT,
            f"asleep at level {int(level)} ({reason}): {timeline.size(residue)} kept per "
            f"device, the rest of its budget free for others; {kept}",
            level=int(level),
            residue_bytes=residue,
        )
        return True

    def sleep_all(self, record: DeploymentRecord, *, reason: str) -> bool:
        """An idle deployment: every copy of it serving goes to sleep, copy 0 first, each at
        the level its node's host memory allows then. A copy other than 0 that cannot sleep
        is stopped alone. False when copy 0 cannot (the caller unloads the deployment, which
        stops every copy)."""
        if not sleeps_when_idle(record, enabled=self.enabled):
            return False
        db = self.reconciler.db
        for copy in deployments.copies_of(db, record.id):
            if copy.status is not DeploymentStatus.DEPLOYED or self.sleep(copy, reason=reason):
                continue
            if copy.copy_of is None:
                return False
            self.reconciler.unload(copy.id, reason=reason)
        return True

    def wake_busy(self) -> None:
        """Each pass: wake the sleepers of this process that requests wait for. Held by the
        gateway: their first wake found no room, and room may have come since (another copy
        went to sleep). In flight: a gateway whose route table was read before the sleep sent
        it to the engine, which holds it while asleep (vLLM's paused scheduler) — unless
        another copy of its deployment serves, where those requests go (a deployment's
        traffic is counted under its id, whichever copy serves it)."""
        reconciler = self.reconciler
        for deployment_id in residency.sleep_levels(reconciler.db):
            activity = reconciler.activity
            waiting = activity.waiting(deployment_id)
            if activity.in_flight(deployment_id) == 0 and waiting == 0:
                continue
            record = deployments.get(reconciler.db, deployment_id)
            if record.claimed_by != reconciler.owner:
                continue
            if waiting == 0 and _another_serves(reconciler.db, record):
                continue
            reconciler.contained(deployment_id, partial(self.wake, record))

    def wake(self, record: DeploymentRecord) -> WakeOutcome:
        """Take a sleeping copy's budget back and wake its engine; when the budget does not
        fit, room is made first as for a placement — idle copies beside it put to sleep,
        else unloaded (`RoomMaker.make_room_to_wake`). One that fails to wake is started
        again inside that budget. Not on its way when no room could be made (nothing
        changes: it sleeps on)."""
        db = self.reconciler.db
        try:
            record = deployments.get(db, record.id)  # as it is now: woken meanwhile?
        except RecordNotFound:
            return WakeOutcome(on_its_way=False, why="it has ended")
        if record.sleep_level is None:
            return WakeOutcome(on_its_way=True)  # awake already
        level = SleepLevel(record.sleep_level)
        shortfall = residency.take_back(db, record.id, measurement=self.reconciler.measurement())
        after = ""
        if shortfall is not None and self.make_room is not None:
            made = self.make_room(record)
            if made is not None:
                after = made
                shortfall = residency.take_back(
                    db, record.id, measurement=self.reconciler.measurement()
                )
        if shortfall is not None:
            return WakeOutcome(on_its_way=False, why=shortfall.message)
        self._unmeasured.pop(record.id, None)
        client = _client(record)
        try:
            if client is None:
                raise SleepError(f"{record.id}: no engine to wake")
            client.wake_up(level)
        except SleepError as err:
            return self._not_woken(record, err)
        residency.awake(db, record.id)
        self.reconciler.activity.serving(record.id)  # requests held for it go on now
        text = f"awake from level {int(level)}: a request needs it"
        timeline.note(db, record.id, EventKind.WOKE, f"{text}, {after}" if after else text)
        return WakeOutcome(on_its_way=True)

    def measure_residues(self) -> None:
        """Each pass: the residue of each copy this process put to sleep becomes what the
        meter measured of its engine, at the first sample taken after the sleep
        (`residency.measure_residue`: never more than its budget). Without a meter no
        sample comes, and the estimate stays."""
        db = self.reconciler.db
        for deployment_id, since in list(self._unmeasured.items()):
            try:
                record = deployments.get(db, deployment_id)
            except RecordNotFound:
                record = None
            if record is None or record.sleep_level is None:
                del self._unmeasured[deployment_id]
                continue
            sampled, used = record.memory_sampled_at, record.memory_used_bytes
            if sampled is None or used is None or sampled < since:
                continue
            del self._unmeasured[deployment_id]
            found = residency.measure_residue(db, deployment_id, measured_bytes=used)
            if found is not None:
                _note_measured(db, deployment_id, found)

    def _not_woken(self, record: DeploymentRecord, err: SleepError) -> WakeOutcome:
        """An engine that did not wake: started again inside the budget just taken back when
        this process drives it (not routable until it is ready again), else unloaded, so the
        next request loads it afresh."""
        db, reconciler = self.reconciler.db, self.reconciler
        if reconciler.restart(record.id):
            residency.awake(db, record.id)
            text = f"waking failed ({err}); starting it again in its budget"
            timeline.note(db, record.id, EventKind.RESTARTED, text)
            return WakeOutcome(on_its_way=True)
        log.warning("deployment %s did not wake (%s); unloading it", record.id, err)
        reconciler.unload(record.id, reason=f"waking failed ({err})")
        return WakeOutcome(on_its_way=False, why=str(err))


def _note_measured(db: Database, deployment_id: str, found: MeasuredResidue) -> None:
    """The `slept` event that says what the ledger holds once the residue was measured."""
    measured, held = timeline.size(found.measured_bytes), timeline.size(found.residue_bytes)
    if found.over_budget:
        text = (
            f"measured asleep at {measured}, above its whole budget of "
            f"{timeline.size(found.budget_bytes)}: {held} held, its budget at most"
        )
        log.warning("deployment %s: %s", deployment_id, text)
    elif found.short_of_room:
        text = f"measured asleep at {measured}: {held} held, all its device had free"
        log.warning("deployment %s: %s", deployment_id, text)
    else:
        text = f"measured asleep at {measured}: held in place of the estimate"
    timeline.note(
        db,
        deployment_id,
        EventKind.SLEPT,
        text,
        measured_bytes=found.measured_bytes,
        residue_bytes=found.residue_bytes,
        budget_bytes=found.budget_bytes,
    )


def _another_serves(db: Database, record: DeploymentRecord) -> bool:
    """Another copy of the record's deployment is awake and serving."""
    found = copyset.serving(deployments.copies_of(db, record.deployment_id))
    return any(other.id != record.id for other in found)


def _client(record: DeploymentRecord) -> SleepClient | None:
    handle = handle_from_json(record.engine_handle)
    if record.status is not DeploymentStatus.DEPLOYED or handle is None or not handle.base_url:
        return None
    return SleepClient(base_url=handle.base_url.rstrip("/"), name=f"deployment {record.id}")
