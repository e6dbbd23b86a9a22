"""Faults the SDK raises; the CLI maps each to one line and an exit code.

CohabitError(message)
├── APIError(message, *, status_code, detail)     the server answered with an error
│   ├── AuthenticationError    401: missing or wrong token
│   ├── PermissionDeniedError  403: the token's role may not do this (a user token)
│   ├── NotFoundError          404: unknown id (or a URL that is not the API root)
│   ├── ValidationError        400 / 422: a body the server cannot serve as written
│   ├── ConflictError          409 (other than a NoFit at admission)
│   └── ServerError            5xx: retried while polling
├── ServerUnreachable(message, *, base_url)        no answer at all: retried while polling
└── DeploymentFailedError(CohabitError, RuntimeError)
        a deployment ended FAILED / ERROR / MUST_REDOWNLOAD / STOPPED while waited on,
        or was refused at admission because it can never fit (then deployment_id is None)

Waiting past `timeout_seconds` raises the built-in `TimeoutError` with `.deployment_id` (and
`.status`, the last status seen), as the kamiwaza SDK does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class CohabitError(Exception):
    """Base of every SDK fault."""


class APIError(CohabitError):
    """The server answered with an HTTP error; `detail` is its `{"detail": …}` value."""

    def __init__(self, message: str, *, status_code: int, detail: Any = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.detail = detail


class AuthenticationError(APIError):
    """401: the server wants a (different) bearer token."""


class PermissionDeniedError(APIError):
    """403: the token is known but its role may not do this (deploy, stop, delete and
    token admin need an admin token)."""


class NotFoundError(APIError):
    """404: no such deployment, model or config."""


class ValidationError(APIError):
    """400 / 422: the request was understood but cannot be served as written."""


class ConflictError(APIError):
    """409."""


class ServerError(APIError):
    """5xx: the server failed; worth retrying."""


class ServerUnreachable(CohabitError):
    """No HTTP answer: connection refused, DNS, or the transport timed out."""

    def __init__(self, message: str, *, base_url: str) -> None:
        super().__init__(message)
        self.base_url = base_url


class DeploymentFailedError(CohabitError, RuntimeError):
    """A deployment reached a failure status (or could never fit). Also a RuntimeError, as the
    kamiwaza SDK's is. `no_fit` carries the structured NoFit when placement refused it."""

    def __init__(
        self,
        message: str,
        *,
        status: str | None = None,
        last_error_code: str | None = None,
        last_error_message: str | None = None,
        deployment_id: str | None = None,
        no_fit: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.last_error_code = last_error_code
        self.last_error_message = last_error_message
        self.deployment_id = deployment_id
        self.no_fit = None if no_fit is None else dict(no_fit)

    @property
    def fix(self) -> str | None:
        """What the docs suggest doing about this failure, if the code is a known one."""
        # Here, not at the top: the table lives with the runtime, which a client that only
        # reads (the command line's `ps`) has no reason to import.
        from cohabit.sdk.fixes import fix_for

        return fix_for(self.last_error_code, self.last_error_message)


def failure_message(deployment_id: str | None, status: str, error_message: str | None) -> str:
    """The kamiwaza SDK's sentence: 'Deployment X entered failure status S: message'."""
    subject = f"Deployment {deployment_id}" if deployment_id else "Deployment"
    sentence = f"{subject} entered failure status {status}"
    return f"{sentence}: {error_message}" if error_message else sentence


def deploy_timeout(deployment_id: str, *, timeout_s: float, status: str | None) -> TimeoutError:
    """The built-in TimeoutError, carrying the deployment it gave up on."""
    error = TimeoutError(
        f"deployment {deployment_id} was not ready after {timeout_s:g} s "
        f"(last status {status or 'unknown'}); it keeps going on the server"
    )
    error.deployment_id = deployment_id  # type: ignore[attr-defined]
    error.status = status  # type: ignore[attr-defined]
    return error


class DownloadFailedError(CohabitError):
    """A download from the Hub ended in error; `failures` maps each file to what was wrong
    (a hash mismatch names the file)."""

    def __init__(self, repo_id: str, failures: dict[str, str]) -> None:
        lines = "; ".join(failures.values())
        super().__init__(f"download of {repo_id} failed: {lines}")
        self.repo_id = repo_id
        self.failures = failures
