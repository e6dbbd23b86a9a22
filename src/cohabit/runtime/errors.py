"""Faults of the runtime layer: a launch request that cannot be turned into a command.

Engine failures after a start (OOM, an exit, a timeout, files missing on disk) are not faults:
they are `EngineStatus` values with a `RuntimeErrorCode`. These are for requests that are
wrong as written, raised by `build_launch()` and `LocalRuntime.start()`::

    LaunchError(ValueError)
     ├── EngineChoiceError    no engine can serve this model on the placed hardware (a
     │                        safetensors checkpoint on a CPU pool, vLLM asked for on Apple)
     └── BudgetTooSmall       the reserved budget cannot hold the smallest useful setting

A running engine asked to sleep or wake (runtime/sleep.py) that does not::

    SleepError(RuntimeError)  unreachable, timed out, or answered other than 200
     └── SleepUnsupported     no sleep routes: started without sleep mode (404)
"""

from __future__ import annotations


class LaunchError(ValueError):
    """A launch request that cannot be started as written; the message names the deployment."""


class EngineChoiceError(LaunchError):
    """No engine can serve this model format on this hardware."""


class BudgetTooSmall(LaunchError):
    """The budget cannot hold weights, activations and the smallest KV cache."""


class SleepError(RuntimeError):
    """An engine did not sleep or wake as asked; the message names the engine and why."""


class SleepUnsupported(SleepError):
    """The engine has no sleep routes: it was started without sleep mode."""


def fault_text(err: BaseException) -> str:
    """One line naming an unexpected fault, its type and message, at most 500 characters, a
    NUL byte written as `\\x00` (PostgreSQL text cannot hold one): what a deployment that a
    fault ended shows as its last_error_message."""
    text = " ".join(str(err).replace("\x00", "\\x00").split()) or "no message"
    return f"{type(err).__name__}: {text}"[:500]
