"""Idle unload as a table: (what is known of a deployment's last use, its keep-alive, now) →
unload or not, with no database and no reconciler (service/control/lifetime.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from cohabit.service.control.lifetime import Unload, Use, idle_s, idle_unload

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def use(
    *,
    in_flight: int = 0,
    here: float | None = None,
    anywhere: float | None = None,
    loaded: float | None = None,
    watched: float = 3600,
) -> Use:
    """Each moment in seconds before NOW (None: never)."""
    return Use(
        in_flight=in_flight,
        used_here=None if here is None else ago(here),
        used_anywhere=None if anywhere is None else ago(anywhere),
        loaded_at=None if loaded is None else ago(loaded),
        watched_since=ago(watched),
    )


CASES: list[tuple[str, Use, int, Unload | None]] = [
    ("idle past its keep-alive here", use(here=301, loaded=900), 300, Unload(why="idle for 301 s")),
    ("used here within the keep-alive", use(here=299, loaded=900), 300, None),
    (
        "exactly the keep-alive is enough",
        use(here=300, loaded=900),
        300,
        Unload(why="idle for 300 s"),
    ),
    (
        "a request in flight keeps it, however old the last use",
        use(in_flight=1, here=9000),
        300,
        None,
    ),
    ("used through another server lately", use(here=900, anywhere=10, loaded=900), 300, None),
    ("loaded a moment ago, never used", use(loaded=5), 300, None),
    ("never used since loaded long ago", use(loaded=600), 300, Unload(why="idle for 600 s")),
    (
        "this server just started: traffic another saw may not be recorded yet",
        use(loaded=9000, watched=10),
        300,
        None,
    ),
    ("a keep-alive of 0 unloads at once", use(loaded=0, watched=0), 0, Unload(why="idle for 0 s")),
]


@pytest.mark.parametrize(
    ("known", "keep_alive_s", "wanted"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_idle_unload(known: Use, keep_alive_s: int, wanted: Unload | None) -> None:
    assert idle_unload(known, keep_alive_s=keep_alive_s, now=NOW) == wanted


def test_idle_seconds_are_since_the_latest_moment_and_none_in_flight() -> None:
    assert idle_s(use(here=50, anywhere=20, loaded=90, watched=70), NOW) == 20
    assert idle_s(use(in_flight=2, here=50), NOW) is None
