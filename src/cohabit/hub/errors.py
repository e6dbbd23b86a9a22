"""What can go wrong talking to the Hub or storing what it sent.

    HubError
    ├── HubUnavailable   offline mode, or the Hub cannot be reached
    ├── RepoNotFound     no such repo, revision or file (or not visible with this token)
    └── FileDamaged      a downloaded file has the wrong size or hash (names the file)

Cancelled is not a fault: a progress callback raises it to stop a download where it is.
"""

from __future__ import annotations


class HubError(Exception):
    """Root of the Hub errors."""


class HubUnavailable(HubError):
    pass


class RepoNotFound(HubError):
    pass


class FileDamaged(HubError):
    def __init__(self, filename: str, detail: str) -> None:
        super().__init__(f"{filename}: {detail}")
        self.filename = filename


class Cancelled(Exception):
    """Raised by a progress callback to stop a download; its part stays for a resume."""
