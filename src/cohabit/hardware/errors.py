"""Faults while finding out what hardware is there; raised by the discovery adapters.

"Not available" (no NVML library, no driver, no GPU) is not a fault: adapters return None
and discovery moves on. These are for a library that is present but fails::

    HardwareError
     └── DiscoveryError        a driver library answered with an error we cannot work around
"""

from __future__ import annotations


class HardwareError(Exception):
    """Base of every hardware fault."""


class DiscoveryError(HardwareError):
    """A discovery library is present but a call failed (GPU lost, no permission, ...).

    `library` is the library ("nvml", "amdsmi", "sysctl"), `call` the function that failed;
    `str()` is one line naming both and the library's own message.
    """

    def __init__(self, library: str, call: str, detail: str) -> None:
        super().__init__(f"{library}: {call} failed: {detail}")
        self.library = library
        self.call = call
        self.detail = detail
