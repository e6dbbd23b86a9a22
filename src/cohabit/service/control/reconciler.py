"""The reconciler: one thread per server process that drives deployments through their
lifecycle — REQUESTED → DEPLOYING (plan and reserve, in one transaction) → INITIALIZING (engine
started) → DEPLOYED (engine ready) — and records NoFit and runtime failures, releasing budgets.

Several processes may share one database: each claims deployments with a lease it renews every
tick, so a deployment whose driver died (SIGKILL) is taken over once the lease runs out; its
engine is re-adopted when still alive, or relaunched inside the budget it still holds.

An engine whose deployment has ended is stopped whichever process finds it: the API's stop
does it at once, and every reconciler sweeps the runtime's engines at its first pass (and
every few leases), for those a crash left between ending a deployment and stopping its engine.

A fault while driving one deployment (the runtime or the store raising for it) ends that
deployment alone, in ERROR with the fault as its message; a pass that fails as a whole (the
database unreachable) is retried, and `health()` reports it until a pass succeeds.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial

from cohabit.estimate.estimate import Estimate
from cohabit.estimate.settings import EngineSettings
from cohabit.hardware.model import Fleet
from cohabit.placement.decision import Placement
from cohabit.placement.reasons import NoFit
from cohabit.placement.request import PlacementRequest
from cohabit.placement.state import Measurement
from cohabit.runtime.errors import fault_text
from cohabit.runtime.interface import (
    EngineHandle,
    EngineRuntime,
    EngineState,
    LaunchRequest,
    RuntimeErrorCode,
    handle_from_json,
    handle_to_json,
)
from cohabit.service.control import timeline
from cohabit.service.control.admission import placement_request
from cohabit.service.control.autoscale import Autoscaler, ScalePolicy
from cohabit.service.control.copies import CopyDriver, has_copies
from cohabit.service.control.failures import engine_failure, no_fit_failure, runtime_failure
from cohabit.service.control.housekeeping import Housekeeping
from cohabit.service.control.lifetime import Lifetime, loads_on_demand
from cohabit.service.control.loading import LoadWatch
from cohabit.service.control.room import RoomMaker
from cohabit.service.control.warm import Warm, sleeps_when_idle
from cohabit.service.errors import InvalidInput
from cohabit.service.telemetry.activity import Activity
from cohabit.service.telemetry.metrics import ReconcilerCounters
from cohabit.store import deployments, ledger, scaling
from cohabit.store.database import Database, utcnow
from cohabit.store.errors import RecordNotFound
from cohabit.store.events import EventKind
from cohabit.store.records import (
    DRIVEN,
    DeploymentFailure,
    DeploymentRecord,
    DeploymentStatus,
)

log = logging.getLogger(__name__)
# How often the engines are looked at between passes while a request is held for one that
# is starting: a probe of each starting engine and one read of the deployments' statuses.
HURRY_S = 0.01


@dataclass(frozen=True, slots=True, kw_only=True)
class Health:
    """How the reconciler is doing, as `/serving/health` shows it."""

    status: str  # "running" | "failing" (its last pass raised) | "stopped"
    reason: str | None = None  # the failing pass's fault, one line
    since: datetime | None = None  # when passes started failing


class Reconciler:
    """Drives the deployments this process has claimed. `run_once()` is one pass (tests call
    it directly); `start()` runs passes on a thread, woken early by `wake()`.

    `fleet_source`: where the fleet comes from when it changes under us (a cluster); it is
    read and stored at most every `fleet_refresh_s`. `budget_unit_bytes`: requests are
    rounded up to this (GiB on Kubernetes, where budgets are whole GiB) so the ledger holds
    what the engine will actually be given.
    """

    def __init__(
        self,
        db: Database,
        runtime: EngineRuntime,
        *,
        poll_interval_s: float = 0.5,
        lease_s: float = 15.0,
        owner: str | None = None,
        fleet_source: Callable[[], Fleet] | None = None,
        fleet_refresh_s: float = 5.0,
        budget_unit_bytes: int = 1,
        activity: Activity | None = None,
        counters: ReconcilerCounters | None = None,
        measurement: Callable[[], Measurement | None] | None = None,
        scale_policy: ScalePolicy | None = None,
        idle_sleep: bool = False,
    ) -> None:
        self.db = db
        self.counters = ReconcilerCounters() if counters is None else counters  # /metrics
        # The gateway's view of each deployment's traffic (in flight, last used).
        self.activity = Activity() if activity is None else activity
        self.budget_unit_bytes = max(1, budget_unit_bytes)
        self.runtime = runtime
        self.poll_interval_s = poll_interval_s
        self.lease_s = lease_s
        self.owner = owner or deployments.owner_id(
            socket.gethostname(), os.getpid(), uuid.uuid4().hex[:8]
        )
        self._engines: dict[str, EngineHandle] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        # One pass at a time (thread and direct callers); re-entrant, as a pass may restart
        # an engine that did not wake (warm.py).
        self._lock = threading.RLock()
        self._failing: tuple[str, datetime] | None = None  # the last pass's fault, and since
        self.housekeeping = Housekeeping(
            db,
            runtime,
            fleet_source=fleet_source,
            fleet_refresh_s=fleet_refresh_s,
            sweep_interval_s=max(4 * lease_s, 10.0),
            stop_engine=self.stop_engine,
        )
        self.warm = Warm(self, enabled=idle_sleep)  # idle vLLM copies sleep, not unload
        self.lifetime = Lifetime(self, warm=self.warm)  # scale to zero, a duration's end
        self.room = RoomMaker(self, self.lifetime)  # preemption and the queue
        self.warm.make_room = self.room.make_room_to_wake  # a wake makes room as a load does
        self.copies = CopyDriver(self)  # placing copies together, failing one alone
        self.autoscaler = Autoscaler(self, policy=scale_policy)  # between min and max copies
        self.loads = LoadWatch(db, self.counters, self.activity)  # phases, as they happen
        # The meter's latest figures, which placement must not count on (memory held outside
        # cohabit), when a meter runs.
        self.measurement: Callable[[], Measurement | None] = measurement or (lambda: None)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="cohabit-reconciler", daemon=True)
        self._thread.start()

    def stop(self, *, timeout_s: float = 10.0) -> None:
        """Stop driving; engines keep running and are re-adopted by the next start."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def let_go(self) -> None:
        """After `stop()`, on a clean shutdown: hand this process's deployments back, so the
        next server takes them over (re-adopting or restarting their engines) at once."""
        self._engines.clear()
        try:
            deployments.let_go(self.db, owner=self.owner)
        except Exception:  # the leases then run out by themselves
            log.exception("handing back this server's deployments failed")

    def wake(self) -> None:
        self._wake.set()

    def load(self, deployment_id: str) -> bool:
        """A request arrived for a deployment that has no engine serving: start loading it
        when it is unloaded (True: it is now on its way to serving; concurrent callers start
        one load between them). False when there is nothing to load (ended, unknown, or
        already starting: the caller waits or refuses). A sleeping one is woken instead,
        room made for its budget as for a load (warm.py)."""
        asleep = self._asleep(deployment_id)
        if asleep is not None:
            with self._lock:  # it may make room: under the pass lock, as preemption is
                outcome = self.warm.wake(asleep)
            if not outcome.on_its_way:
                log.info("deployment %s stays asleep: %s", deployment_id, outcome.why)
            return outcome.on_its_way
        if not scaling.load(self.db, deployment_id):
            return False
        timeline.note(self.db, deployment_id, EventKind.LOADING, "loading on demand")
        self.wake()
        return True

    def _asleep(self, deployment_id: str) -> DeploymentRecord | None:
        try:
            record = deployments.get(self.db, deployment_id)
        except RecordNotFound:
            return None
        return record if record.sleep_level is not None else None

    def unload(self, deployment_id: str, *, reason: str) -> bool:
        """Scale a DEPLOYED deployment to zero: UNLOADED with its budget released (one
        transaction), then its engine stopped, and an `unloaded` event with `reason`. False
        when it is not DEPLOYED any more, or has requests in flight through this server.
        Any process may unload any deployment: its driver, seeing UNLOADED, lets it go."""
        if self.activity.in_flight(deployment_id) > 0:
            return False
        return self.copies.unload(deployment_id, reason=reason)

    def restart(self, deployment_id: str) -> bool:
        """Stop the engine of a deployment this process drives and start it again inside the
        budget it holds (the over-budget policy `restart`). False when it drives none."""
        with self._lock:
            handle = self._engines.pop(deployment_id, None)
            if handle is None:
                return False
            self.stop_engine(handle)
            record = deployments.get(self.db, deployment_id)
            self.contained(deployment_id, partial(self._resume, record))
            return True

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def health(self) -> Health:
        failing = self._failing
        if not self.running:
            return Health(status="stopped", reason=failing[0] if failing else None)
        if failing is not None:
            return Health(status="failing", reason=failing[0], since=failing[1])
        return Health(status="running")

    def _loop(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                self.run_once()
            except Exception:  # a bad pass must not end the loop; the next one retries
                log.exception("reconciler pass failed")
            self.counters.pass_took(time.monotonic() - started)
            due = time.monotonic() + self.poll_interval_s
            self._hurry(due)
            self._wake.wait(max(0.0, due - time.monotonic()))
            self._wake.clear()

    def _hurry(self, until: float) -> None:
        """While requests are held for a deployment whose engine this process is starting,
        look at the engines alone every `HURRY_S` (until the next pass is due, or a wake), so a
        held request goes on within milliseconds of its engine answering, not a pass later."""
        while (
            self.activity.held() & self._engines.keys()
            and not self._wake.is_set()
            and not self._stopping.is_set()
            and time.monotonic() < until
        ):
            with self._lock:
                try:
                    self._poll()
                except Exception:
                    log.exception("reconciler look at starting engines failed")
                    return
            self._wake.wait(HURRY_S)

    def run_once(self) -> None:
        """One pass. A fault in one deployment's step ends that deployment alone; any other
        fault is raised, and kept for `health()` until a pass succeeds."""
        with self._lock:
            try:
                self.housekeeping.refresh_fleet()
                deployments.renew(self.db, owner=self.owner, lease_s=self.lease_s)
                self.housekeeping.sweep()
                for record in deployments.claim(self.db, owner=self.owner, lease_s=self.lease_s):
                    self.contained(record.id, partial(self._take, record))
                self.room.serve_queue()
                self._poll()
                self.loads.first_tokens()
                self.lifetime.note_use()
                self.lifetime.unload_idle()
                self.warm.wake_busy()
                self.warm.measure_residues()
                self.autoscaler.run()
                self.lifetime.end_durations()
            except Exception as err:
                since = self._failing[1] if self._failing else utcnow()
                self._failing = (fault_text(err), since)
                raise
            self._failing = None

    def contained(self, deployment_id: str, step: Callable[[], object]) -> None:
        """Run one deployment's step; a fault in it ends that deployment (ERROR, the fault as
        its message, its budget released, its engine stopped) and no other. When even that
        cannot be written, the lease runs out and a later pass takes it up again."""
        try:
            step()
        except Exception as err:
            log.exception("driving deployment %s failed", deployment_id)
            self._engines.pop(deployment_id, None)
            failure = runtime_failure(RuntimeErrorCode.RUNTIME_ERROR, fault_text(err))
            try:
                ended = self._end(deployment_id, failure)
            except Exception:
                log.exception("recording the fault of deployment %s failed", deployment_id)
                return
            if ended is not None:  # still ours: its engine must not outlive its budget
                stored = handle_from_json(ended.engine_handle)
                self.stop_engine(stored or EngineHandle(deployment_id=deployment_id))

    def _requested_bytes(self, record: DeploymentRecord) -> int:
        unit = self.budget_unit_bytes
        return -(-record.requested_bytes // unit) * unit

    # --- taking a deployment over -------------------------------------------------------

    def _take(self, record: DeploymentRecord) -> None:
        if record.status is DeploymentStatus.REQUESTED:
            if self.advance(record.id, (DeploymentStatus.REQUESTED,), DeploymentStatus.DEPLOYING):
                self._place(record)
        elif record.status is DeploymentStatus.DEPLOYING and record.placement is None:
            self._place(record)  # its last driver died before reserving
        else:
            self._resume(record)

    def wanted(self, record: DeploymentRecord) -> PlacementRequest:
        """What the deployment asks of the fleet (InvalidInput when it cannot be asked)."""
        return placement_request(
            record.id,
            requested_bytes=self._requested_bytes(record),
            tensor_parallel=record.tensor_parallel,
            engine=record.engine,
            force_cpu=bool(record.request.get("force_cpu")),
        )

    def place_taken(self, record: DeploymentRecord) -> None:
        """Place a deployment this process has just taken (off the queue), contained."""
        self.contained(record.id, partial(self._place, record))

    def retry_later(self, deployment_id: str) -> None:
        """Back to REQUESTED with no driver: the next pass claims and places it afresh."""
        values: dict[str, object] = {"claimed_by": None, "claimed_until": None}
        self.advance(
            deployment_id, (DeploymentStatus.DEPLOYING,), DeploymentStatus.REQUESTED, values
        )

    def _place(self, record: DeploymentRecord) -> None:
        """Reserve a placement; when nothing fits, make room by unloading idle copies of lower
        priority; when that cannot help either, the NoFit: queued (`queue`), back to UNLOADED
        (a load on demand), or the deployment fails."""
        try:
            wanted = self.wanted(record)
        except InvalidInput as err:
            self._end(record.id, runtime_failure(RuntimeErrorCode.RUNTIME_ERROR, str(err)))
            return
        decision: Placement | NoFit | None
        if has_copies(record):  # with its waiting copies, spread from the placed ones
            decision = self.copies.reserve(record, wanted)
        else:
            decision = ledger.reserve(
                self.db,
                deployment_id=record.id,
                owner=self.owner,
                request=wanted,
                measurement=self.measurement(),
            )
        if isinstance(decision, NoFit) and not self.copies.grouped(record):
            decision = self.room.make_room(record, wanted, decision)
        if decision is None:
            return
        self.counters.placement(decision)
        if isinstance(decision, NoFit):
            topology = ledger.current_state(self.db).fleet.topology.value
            failure = self.copies.failure(record, no_fit_failure(decision, topology))
            if record.copy_of is not None:  # one more copy: the deployment serves on
                self._end(record.id, replace(failure, status=DeploymentStatus.STOPPED))
            elif loads_on_demand(record):
                self._no_room_to_load(record, failure)
            elif record.scaling.queue:
                self.room.enqueue(record, failure)
            else:
                self._end(record.id, failure)
            return
        # and reserved; after unloading idle copies, the room maker's explanation
        explained = self.room.explained.pop(record.id, None) or self.copies.explained.pop(
            record.id, None
        )
        timeline.placed(self.db, record.id, decision, preemption=explained)
        self.launch(record, decision, allowed=(DeploymentStatus.DEPLOYING,))

    def _resume(self, record: DeploymentRecord) -> None:
        """A deployment that holds its budget: adopt its engine, or start it again."""
        if self.copies.resume_restart(record):
            return
        # No stored handle: its last driver died between starting the engine and recording
        # it; the runtime may still know the engine by the deployment's id alone.
        # A fault while adopting raises (the deployment then ends in ERROR): relaunching could
        # start a second engine beside one that still runs.
        stored = handle_from_json(record.engine_handle) or EngineHandle(deployment_id=record.id)
        handle = self.runtime.adopt(stored)
        if handle is not None:
            self._engines[record.id] = handle
            if record.status is DeploymentStatus.DEPLOYING:  # died before recording it
                values: dict[str, object] = {"engine_handle": handle_to_json(handle)}
                if self.advance(
                    record.id, (DeploymentStatus.DEPLOYING,), DeploymentStatus.INITIALIZING, values
                ):
                    timeline.started(self.db, record.id, record.engine, handle)
            return
        placement = ledger.held_placement(self.db, record.id, self.wanted(record))
        if placement is None:
            message = "its reservation is gone (a device left the fleet); deploy it again"
            self._end(record.id, runtime_failure(RuntimeErrorCode.RUNTIME_ERROR, message))
            return
        self.launch(
            record,
            placement,
            allowed=(
                DeploymentStatus.DEPLOYING,
                DeploymentStatus.INITIALIZING,
                DeploymentStatus.DEPLOYED,
            ),
        )

    def launch(
        self,
        record: DeploymentRecord,
        placement: Placement,
        *,
        allowed: Iterable[DeploymentStatus],
        to: DeploymentStatus = DeploymentStatus.INITIALIZING,
    ) -> None:
        """Start the engine inside `placement` and move the record to `to` with its handle
        (to DEPLOYED: a copy 0 starting again while another copy serves, whose handle is
        written once its engine is ready, so that nothing routes to it before)."""
        if record.model_path is None:
            message = (
                f"{record.model_name}: its files are not on this machine; "
                "download them and register the local copy"
            )
            self._end(record.id, runtime_failure(RuntimeErrorCode.MUST_REDOWNLOAD, message))
            return
        launch = LaunchRequest.inside(
            placement,
            deployment_id=record.id,
            engine=record.engine,
            model_path=record.model_path,
            served_model_name=record.model_name,
            settings=EngineSettings.from_dict(record.engine_settings),
            estimate=None if record.estimate is None else Estimate.from_dict(record.estimate),
            sleep_mode=sleeps_when_idle(record, enabled=self.warm.enabled),
        )
        try:
            handle = self.runtime.start(launch)
        except Exception as err:  # the runtime could not even start it: record why
            log.exception("starting the engine of %s failed", record.id)
            self.counters.engine_failed(RuntimeErrorCode.RUNTIME_ERROR)
            failure = runtime_failure(RuntimeErrorCode.RUNTIME_ERROR, fault_text(err))
            self._end(record.id, failure)
            return
        self.counters.engine_started()
        stored = None if to is DeploymentStatus.DEPLOYED else handle_to_json(handle)
        if self.advance(record.id, allowed, to, {"engine_handle": stored}):
            self._engines[record.id] = handle
            timeline.started(self.db, record.id, record.engine, handle)
        else:  # stopped while starting: the engine must not outlive its budget
            self.stop_engine(handle)

    def _no_room_to_load(self, record: DeploymentRecord, failure: DeploymentFailure) -> None:
        """A load on demand that does not fit leaves the deployment UNLOADED (still listed
        and routable, the NoFit recorded), so a later request tries again."""
        if scaling.unload(
            self.db,
            record.id,
            allowed=(DeploymentStatus.DEPLOYING,),
            owner=self.owner,
            failure=failure,
        ):
            reason = f"no room to load it: {failure.message}"
            timeline.note(self.db, record.id, EventKind.UNLOADED, reason, reason=reason)

    # --- watching engines ---------------------------------------------------------------

    def _poll(self) -> None:
        current = deployments.statuses(self.db, list(self._engines))
        for deployment_id, handle in list(self._engines.items()):
            status, driver = current.get(deployment_id, (DeploymentStatus.STOPPED, None))
            if status not in DRIVEN:
                del self._engines[deployment_id]
                # stopped through the API (or failed, or unloaded, elsewhere)
                self.stop_engine(handle)
                continue
            if driver != self.owner:
                del self._engines[deployment_id]  # another process drives it now
                continue
            self.contained(deployment_id, partial(self._check, deployment_id, handle, status))

    def _check(self, deployment_id: str, handle: EngineHandle, status: DeploymentStatus) -> None:
        engine = self.runtime.status(handle)  # a fault here ends this deployment (_contained)
        served = status is DeploymentStatus.DEPLOYED
        failure = engine_failure(engine, served=served)
        restarted = deployment_id in self.copies.restarting
        loading = not served or restarted
        if loading:
            self.loads.progress(deployment_id, engine)
        if loading and failure is None and engine.state is EngineState.READY:
            if engine.pid is not None and engine.pid != handle.pid:
                handle = replace(handle, pid=engine.pid)  # it was held when started
                self._engines[deployment_id] = handle
            values: dict[str, object] = {"engine_handle": handle_to_json(handle)}
            was = DeploymentStatus.DEPLOYED if restarted else DeploymentStatus.INITIALIZING
            if self.advance(deployment_id, (was,), DeploymentStatus.DEPLOYED, values):
                self.activity.serving(deployment_id)  # requests held for it go on now
                self.loads.ready(deployment_id, pid=handle.pid)
            self.copies.serving_again(deployment_id)
        if failure is None:
            return
        self.counters.engine_failed(RuntimeErrorCode(failure.code))
        del self._engines[deployment_id]
        if self.copies.survive(deployment_id, handle, failure):
            return  # another copy serves: this one starts again
        self._end(deployment_id, failure)
        self.stop_engine(handle)

    # --- store helpers ------------------------------------------------------------------

    def advance(
        self,
        deployment_id: str,
        allowed: Iterable[DeploymentStatus],
        to: DeploymentStatus,
        values: dict[str, object] | None = None,
    ) -> bool:
        return deployments.advance(
            self.db, deployment_id, owner=self.owner, allowed=allowed, to=to, values=values
        )

    def _end(self, deployment_id: str, failure: DeploymentFailure) -> DeploymentRecord | None:
        ended = deployments.end(self.db, deployment_id, failure=failure, owner=self.owner)
        if ended is not None:
            timeline.ended(self.db, deployment_id, failure)
            self.copies.end_others(ended, deployments.failure_values(failure))
        return ended

    def forget(self, deployment_id: str) -> EngineHandle | None:
        """Stop driving this engine here (its record ended elsewhere); its handle."""
        return self._engines.pop(deployment_id, None)

    def stop_engine(self, handle: EngineHandle) -> None:
        self.activity.withdraw(handle.deployment_id, handle.base_url)  # no new requests to it
        try:
            self.runtime.stop(handle)
        except Exception:
            log.exception("stopping the engine of %s failed", handle.deployment_id)
