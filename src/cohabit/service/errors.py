"""Faults the service raises; `app.py` maps each to its HTTP status and a `{"detail": …}` body
(an InvalidInput's detail is a list of problems, the shape FastAPI's own 422s have).

ServiceError
├── NotFound             unknown model, config, file or deployment id       → 404
├── InvalidInput         a body or setting that cannot be served as written  → 422
├── NeverFits            bigger than every device of the fleet (at admission) → 409
├── Conflict             the change does not apply to the row as it is now     → 409
├── RuntimeUnavailable   the engine runtime cannot be built on this machine
├── HubUnreachable       the Hugging Face Hub cannot be asked (offline mode, network) → 503
└── HubAnswerRefused     the Hub answered what cannot be stored safely (a listed name that
                         leaves its folder, a malformed size, hash or commit)              → 502
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from cohabit.hub import errors as hub_errors
from cohabit.store import errors as store_errors

T = TypeVar("T")


class ServiceError(Exception):
    """Base of every service fault."""


class NotFound(ServiceError):
    """No such id."""


class InvalidInput(ServiceError):
    """The request names something that exists but cannot be served as asked. `loc` says
    where, as a validation error's `loc` does: `("body", "path")`, or `("body",)` for the
    request as a whole."""

    def __init__(self, message: str, *, loc: tuple[str | int, ...] = ("body",)) -> None:
        super().__init__(message)
        self.loc = loc


class NeverFits(ServiceError):
    """The request cannot fit even on the empty fleet; `body` is the structured NoFit."""

    def __init__(self, message: str, body: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.body = dict(body)


class Conflict(ServiceError):
    """The change does not apply now (e.g. deleting a model that is deployed)."""


class RuntimeUnavailable(ServiceError):
    """No engine runtime can run here (its module or its engine is missing)."""


def found(load: Callable[[], T]) -> T:
    """Run a store call; the store's NotFound and Conflict become the service's (404, 409)."""
    try:
        return load()
    except store_errors.RecordNotFound as err:
        raise NotFound(str(err)) from None
    except store_errors.Conflict as err:
        raise Conflict(str(err)) from None


class HubUnreachable(ServiceError):
    """The Hub cannot be asked now: offline mode (HF_HUB_OFFLINE) or no network."""


class HubAnswerRefused(ServiceError):
    """The Hub (or a mirror, or what stands between) answered something this server refuses
    to store: an upstream fault, as a gateway's 502 says, not the request's (4xx) and not one
    that asking again mends (503 invites a retry that gets the same answer)."""


def from_hub(call: Callable[[], T]) -> T:
    """Run a Hub call; its errors become the service's (404, 422 for a malformed repo id or a
    damaged file, 502 for a refused answer, 503)."""
    try:
        return call()
    except hub_errors.RepoNotFound as err:
        raise NotFound(str(err)) from None
    except (hub_errors.FileDamaged, hub_errors.BadRepoId) as err:
        raise InvalidInput(str(err)) from None
    except hub_errors.Refused as err:
        raise HubAnswerRefused(f"the Hub's answer is refused: {err}") from None
    except hub_errors.HubError as err:
        raise HubUnreachable(str(err)) from None
