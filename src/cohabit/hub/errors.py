"""What can go wrong talking to the Hub or storing what it sent.

    HubError
    ├── HubUnavailable   offline mode, or the Hub cannot be reached
    ├── RepoNotFound     no such repo, revision or file (or not visible with this token)
    ├── BadRepoId        a repo id the Hub cannot have (asked for by a user)
    ├── FileDamaged      a downloaded file has the wrong size or hash (names the file)
    └── Refused          an answer that cannot be stored safely: a listed name, size, hash or
                         commit that would reach outside its folder or past its size, or a
                         link already in the way (names the field)

Cancelled is not a fault: a progress callback raises it to stop a download where it is.
"""

from __future__ import annotations


class HubError(Exception):
    """Root of the Hub errors."""


class HubUnavailable(HubError):
    pass


class RepoNotFound(HubError):
    pass


class BadRepoId(HubError):
    pass


class FileDamaged(HubError):
    def __init__(self, filename: str, detail: str) -> None:
        super().__init__(f"{filename}: {detail}")
        self.filename = filename


class Refused(HubError):
    """`field` names what was refused as the Hub's JSON or headers spell it
    (`siblings[2].rfilename`, `sha`), or the file whose place is taken."""

    def __init__(self, field: str, detail: str) -> None:
        super().__init__(f"{field}: {detail}")
        self.field = field


class Cancelled(Exception):
    """Raised by a progress callback to stop a download; its part stays for a resume."""
