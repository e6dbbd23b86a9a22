"""Where a load's time goes: the one table of a load's phases, each between two moments of
its timeline, and what is read from the timeline with it — the phases of a finished load
(the `healthy` event's `load_phases_s`, the load-phase histogram) and the progress of one
under way (the API's `loading` field). Pure but for `current_load`, which reads the events.

A load's moments, in order, are its events: asked (`requested` for a deploy, `loading` for
a load on demand), `placed`, `started` (the engine's process), `engine_imported` and
`weights_loaded` (when the engine's log shows them, runtime/milestones.py), `healthy` (it
answers) and `first_token` (the first answer to a request held for the load began).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from cohabit.store import events
from cohabit.store.database import Database
from cohabit.store.events import EventKind, EventRecord
from cohabit.store.records import DeploymentRecord, DeploymentStatus

ASKED = "asked"  # the moment a load begins: its `requested` or `loading` event
_BEGINS = (EventKind.REQUESTED.value, EventKind.LOADING.value)
_K = EventKind
ENGINE_PARTS = ("engine_import", "weights_load", "engine_warmup")  # engine_load, as its log shows
FIRST_TOKEN = "first_token"

# Each phase: its name, and the moments it runs from and to. `engine_load` spans the
# engine's three parts; each part is there when the engine's log showed the milestones it
# runs between (all three, adding up to `engine_load`, when it showed both).
PHASES: tuple[tuple[str, str, str], ...] = (
    ("placing", ASKED, _K.PLACED.value),
    ("starting", _K.PLACED.value, _K.STARTED.value),
    (ENGINE_PARTS[0], _K.STARTED.value, _K.ENGINE_IMPORTED.value),
    (ENGINE_PARTS[1], _K.ENGINE_IMPORTED.value, _K.WEIGHTS_LOADED.value),
    (ENGINE_PARTS[2], _K.WEIGHTS_LOADED.value, _K.HEALTHY.value),
    ("engine_load", _K.STARTED.value, _K.HEALTHY.value),
    (FIRST_TOKEN, _K.HEALTHY.value, _K.FIRST_TOKEN.value),
)
LOAD_PHASES = tuple(name for name, _begin, _end in PHASES)
# The moments after the ask, in the order a load passes them.
_MOMENTS = (
    _K.PLACED.value,
    _K.STARTED.value,
    _K.ENGINE_IMPORTED.value,
    _K.WEIGHTS_LOADED.value,
    _K.HEALTHY.value,
)
# Statuses a deployment loads in (its `loading` progress is shown).
LOADING_STATUSES = (
    DeploymentStatus.REQUESTED,
    DeploymentStatus.DEPLOYING,
    DeploymentStatus.INITIALIZING,
)
RECENT_EVENTS = 16  # a load writes a handful; a preemption's or a restart's a few more


def moments(recent: list[EventRecord]) -> dict[str, datetime]:
    """The moments of the last load in `recent` (a deployment's events, oldest first): when
    it was asked for, then the latest of each later moment; empty when no load begins
    there. A moment earlier than the one before it in `_MOMENTS` order (a placement from
    an earlier load, a milestone from a run before a restart) is left out."""
    found: dict[str, datetime] = {}
    for event in reversed(recent):
        if event.kind in _BEGINS:
            found[ASKED] = event.at
            break
        if event.kind in _MOMENTS and event.kind not in found:
            found[event.kind] = event.at
    else:
        return {}
    kept = {ASKED: found[ASKED]}
    last = found[ASKED]
    for kind in _MOMENTS:
        at = found.get(kind)
        if at is not None and at >= last:
            kept[kind] = at
            last = at
    return kept


def phase_seconds(at: Mapping[str, datetime]) -> dict[str, float]:
    """Each phase whose two moments are both in `at`, in seconds (ms), in `PHASES` order."""
    return {
        name: round(max(0.0, (at[end] - at[begin]).total_seconds()), 3)
        for name, begin, end in PHASES
        if begin in at and end in at
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadProgress:
    """A load under way: its current phase since when, and the phases it has finished."""

    began_at: datetime  # when it was asked for
    phase: str  # a name of `PHASES`
    since: datetime  # when the current phase began
    elapsed_s: float  # how long the current phase has lasted, as of `as_of`
    as_of: datetime
    phases_s: dict[str, float]  # the finished phases, in seconds

    def to_dict(self) -> dict[str, object]:
        return {
            "phase": self.phase,
            "elapsed_s": self.elapsed_s,
            "since": self.since,
            "began_at": self.began_at,
            "as_of": self.as_of,
            "phases_s": dict(self.phases_s),
        }


def progress(recent: list[EventRecord], now: datetime) -> LoadProgress | None:
    """The progress of the load under way in `recent`; None when no load begins there or it
    has finished. The current phase is the one that begins at the latest moment — while
    the engine has shown none of its own, `engine_load` (its parts may never show)."""
    at = moments(recent)
    if not at or _K.HEALTHY.value in at:
        return None
    latest = max(at, key=lambda moment: at[moment])
    current = [name for name, begin, _end in PHASES if begin == latest][-1]
    since = at[latest]
    # An event written between taking `now` and reading the events is later than `now`:
    # the record is then as of that event, never of a moment before what it shows.
    as_of = max(now, since)
    return LoadProgress(
        began_at=at[ASKED],
        phase=current,
        since=since,
        elapsed_s=round((as_of - since).total_seconds(), 3),
        as_of=as_of,
        phases_s=phase_seconds(at),
    )


def current_load(db: Database, record: DeploymentRecord, now: datetime) -> LoadProgress | None:
    """The progress of `record`'s load while it loads (one read of its last events); None
    otherwise, without reading."""
    if record.status not in LOADING_STATUSES:
        return None
    return progress(events.latest(db, record.id, limit=RECENT_EVENTS), now)
