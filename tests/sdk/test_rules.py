"""The SDK's pure rules, as tables: which statuses end a wait and how, which poll errors are
retried (5xx and no answer, three in a row at most; never a 4xx), when the wait times out,
which log lines are new, the fix for each error code, the endpoint of a deployment, and the
two shapes of a status answer. No server: these are values in, values out."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from cohabit.placement.reasons import HINTS, NoFitReason
from cohabit.sdk import calls
from cohabit.sdk.errors import (
    APIError,
    CohabitError,
    DeploymentFailedError,
    NotFoundError,
    ServerError,
    ServerUnreachable,
    ValidationError,
)
from cohabit.sdk.fixes import RUNTIME_FIXES, fix_for
from cohabit.sdk.schemas import Deployment
from cohabit.sdk.serving import endpoint_url
from cohabit.sdk.waiting import MAX_TRANSIENT_POLL_ERRORS, Wait, new_lines

DEPLOYMENT_ID = uuid.UUID(int=7)


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def record(status: str, **fields: Any) -> Deployment:
    return Deployment(id=DEPLOYMENT_ID, m_id=uuid.UUID(int=1), status=status, **fields)


def wait(timeout_s: float | None = 10.0, clock: Clock | None = None) -> Wait:
    return Wait(
        deployment_id=str(DEPLOYMENT_ID),
        timeout_s=timeout_s,
        poll_interval_s=2.0,
        clock=clock or Clock(),
    )


@pytest.mark.parametrize(
    ("status", "ends"),
    [
        ("REQUESTED", None),
        ("DEPLOYING", None),
        ("INITIALIZING", None),
        ("QUEUED", None),  # waiting for room: keep polling until it is placed
        ("deployed", "ready"),
        ("UNLOADED", "ready"),  # routable: its first request loads it
        ("FAILED", "failed"),
        ("ERROR", "failed"),
        ("MUST_REDOWNLOAD", "failed"),
        ("STOPPED", "failed"),
    ],
    ids=lambda value: str(value),
)
def test_which_statuses_end_the_wait(status: str, ends: str | None) -> None:
    current = record(status, last_error_code="OOM", last_error_message="CUDA out of memory")
    if ends == "failed":
        with pytest.raises(DeploymentFailedError) as failed:
            wait().outcome(current)
        assert failed.value.status == status
        assert failed.value.deployment_id == str(DEPLOYMENT_ID)
        assert (failed.value.last_error_code, failed.value.fix) == ("OOM", RUNTIME_FIXES["OOM"])
        assert str(failed.value) == (
            f"Deployment {DEPLOYMENT_ID} entered failure status {status}: CUDA out of memory"
        )
    else:
        assert (wait().outcome(current) is current) == (ends == "ready")


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (ServerError("503: busy", status_code=503), True),
        (ServerUnreachable("connection refused", base_url="http://x/api"), True),
        (NotFoundError("404: no such deployment", status_code=404), False),
        (ValidationError("422: bad id", status_code=422), False),
        (APIError("401: token", status_code=401), False),
    ],
    ids=["5xx", "no-answer", "404", "422", "401"],
)
def test_which_poll_errors_are_retried(error: CohabitError, retried: bool) -> None:
    current = wait()
    if not retried:
        with pytest.raises(type(error)):
            current.failed_poll(error)
        return
    for _ in range(MAX_TRANSIENT_POLL_ERRORS - 1):
        current.failed_poll(error)  # swallowed
    with pytest.raises(type(error)):
        current.failed_poll(error)  # the one too many


def test_a_good_poll_resets_the_transient_error_count() -> None:
    current = wait()
    busy = ServerError("502: bad gateway", status_code=502)
    for _ in range(5):
        current.failed_poll(busy)
        current.failed_poll(busy)
        current.outcome(record("INITIALIZING"))
    assert current.transient_errors == 0


def test_the_wait_times_out_with_the_builtin_error_and_the_deployment_id() -> None:
    clock = Clock()
    current = wait(timeout_s=5.0, clock=clock)
    current.outcome(record("INITIALIZING"))
    assert current.pause_s() == 2.0
    clock.now_s += 4.0
    assert current.pause_s() == pytest.approx(1.0)  # clipped to the time left
    assert current.request_timeout_s() == pytest.approx(1.0)
    clock.now_s += 1.0
    with pytest.raises(TimeoutError) as late:
        current.pause_s()
    assert late.value.deployment_id == str(DEPLOYMENT_ID)  # type: ignore[attr-defined]
    assert late.value.status == "INITIALIZING"  # type: ignore[attr-defined]
    assert wait(timeout_s=None).pause_s() == 2.0  # no timeout: waits for ever


@pytest.mark.parametrize(
    ("seen", "current", "new"),
    [
        ([], ["a", "b"], ["a", "b"]),
        (["a", "b"], ["a", "b"], []),
        (["a", "b"], ["a", "b", "c"], ["c"]),
        (["a", "b", "c"], ["b", "c", "d", "e"], ["d", "e"]),  # the tail window moved
        (["a", "b"], ["x", "y"], ["x", "y"]),  # nothing in common: all of it is new
    ],
    ids=["first", "nothing-new", "appended", "window-moved", "disjoint"],
)
def test_new_log_lines(seen: list[str], current: list[str], new: list[str]) -> None:
    assert new_lines(seen, current) == new


@pytest.mark.parametrize(
    ("code", "message", "fix"),
    [
        (
            "NoFitError",
            "insufficient_capacity: 0/1 nodes fit: 1 insufficient GPU memory",
            HINTS[NoFitReason.INSUFFICIENT_CAPACITY],
        ),
        ("NoFitError", "vendor_mismatch: 0/2 nodes fit", HINTS[NoFitReason.VENDOR_MISMATCH]),
        ("OOM", "CUDA out of memory", RUNTIME_FIXES["OOM"]),
        ("STARTUP_TIMEOUT", None, RUNTIME_FIXES["STARTUP_TIMEOUT"]),
        ("SOMETHING_NEW", "?", None),
        (None, None, None),
    ],
    ids=["no-fit-capacity", "no-fit-vendor", "oom", "startup-timeout", "unknown", "none"],
)
def test_the_fix_for_each_code(code: str | None, message: str | None, fix: str | None) -> None:
    assert fix_for(code, message) == fix


def test_every_runtime_error_code_has_a_fix() -> None:
    from cohabit.runtime.interface import RuntimeErrorCode

    assert set(RUNTIME_FIXES) == {code.value for code in RuntimeErrorCode}


@pytest.mark.parametrize(
    ("fields", "url"),
    [
        ({}, f"http://h:8420/runtime/models/{DEPLOYMENT_ID}/v1"),
        ({"access_path": "/models/abc"}, "http://h:8420/models/abc/v1"),
        ({"access_path": "/models/abc/v1/"}, "http://h:8420/models/abc/v1"),
        ({"endpoint": "https://gw.example/runtime/models/x/v1"}, "https://gw.example/runtime/models/x/v1"),
    ],
    ids=["canonical", "access-path", "access-path-with-v1", "server-endpoint"],
)  # fmt: skip
def test_the_endpoint_of_a_deployment(fields: dict[str, str], url: str) -> None:
    assert endpoint_url("http://h:8420/api", record("DEPLOYED", **fields)) == url


@pytest.mark.parametrize(
    "answer", ["DEPLOYED", {"status": "DEPLOYED", "id": str(DEPLOYMENT_ID)}], ids=["str", "object"]
)
def test_the_status_answer_may_be_a_string_or_an_object(answer: Any) -> None:
    assert calls.deployment_status(DEPLOYMENT_ID).parse(answer) == "DEPLOYED"
