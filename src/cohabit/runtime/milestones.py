"""Finding the milestones of an engine's load in its log: the spawner keeps one `LogWatch` per
starting engine and, at each `status()` poll, reads what the engine wrote since the last look
and notes the time each milestone's line (`LaunchSpec.milestones`) first appears.

A milestone's time is therefore the poll that found it, not the moment the engine wrote the
line: as fine as the control loop polls (every 10 ms while a request is held for the load,
else once a reconciler pass). A line that never comes (another engine version, a launch
that skips the step) leaves its milestone out; nothing waits for it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from cohabit.runtime.engines.spec import Markers
from cohabit.runtime.interface import MilestoneSeen

LINE_CHARS = 300  # the part of a marking line kept (an engine's line may carry a long path)
_READ_BYTES = 1024 * 1024  # at most this much per look: a start-up's log is a few KiB


def _now() -> datetime:
    return datetime.now(UTC)


class LogWatch:
    """The milestones `markers` names, as first seen in the log at `path`, read from byte
    `offset` on (what the spawner wrote before the engine started is not the engine's).
    Lines starting with `skip` (the spawner's own) are passed over. When the file is shorter
    than what was read (rotated by its writer), reading starts again at its beginning."""

    def __init__(
        self,
        path: Path,
        markers: Markers,
        *,
        offset: int = 0,
        skip: str = "",
        clock: Callable[[], datetime] = _now,
    ) -> None:
        self.path = path
        self.markers = markers
        self.offset = offset
        self.skip = skip
        self._clock = clock
        self._partial = b""  # a line the engine has not finished writing yet
        self._seen: list[MilestoneSeen] = []

    @property
    def seen(self) -> tuple[MilestoneSeen, ...]:
        return tuple(self._seen)

    @property
    def done(self) -> bool:
        return len(self._seen) == len(self.markers)

    def look(self) -> None:
        """Read what the engine wrote since the last look; note each milestone whose line
        appears for the first time, at this moment. A log that cannot be read is looked at
        again at the next poll."""
        if self.done:
            return
        data = self._read()
        if not data:
            return
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()[-_READ_BYTES:]
        now = self._clock()
        found = {seen.milestone for seen in self._seen}
        for raw in lines:
            line = raw.decode("utf-8", errors="replace")
            if self.skip and line.startswith(self.skip):
                continue
            for milestone, text in self.markers:
                if milestone not in found and text in line:
                    found.add(milestone)
                    self._seen.append(
                        MilestoneSeen(milestone=milestone, at=now, line=line[:LINE_CHARS])
                    )

    def _read(self) -> bytes:
        data = b""
        with contextlib.suppress(OSError), self.path.open("rb") as log:
            size = os.fstat(log.fileno()).st_size
            if size < self.offset:  # rotated: the new file holds what came after
                self.offset, self._partial = 0, b""
            log.seek(self.offset)
            data = log.read(_READ_BYTES)
        self.offset += len(data)
        return data
