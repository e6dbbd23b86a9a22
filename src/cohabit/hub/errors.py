"""What can go wrong talking to the Hub or storing what it sent.

    HubError
    ├── HubUnavailable   offline mode, or the Hub cannot be reached
    ├── RepoNotFound     no such repo, revision or file (or not visible with this token)
    └── FileDamaged      a downloaded file has the wrong size or hash (names the file)
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
