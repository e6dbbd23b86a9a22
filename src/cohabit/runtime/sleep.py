"""A client for vLLM's sleep routes: put a running engine to sleep, wake it, ask whether it
sleeps. The control loop calls it for copies that go to the warm tier instead of unloading.

What vLLM serves (vllm/entrypoints/serve/sleep/api_router.py, attached in
vllm/entrypoints/openai/api_server.py `build_app` only when `VLLM_SERVER_DEV_MODE` is set,
vllm/envs.py; the engine needs `--enable-sleep-mode` to hand memory back):

- `POST /sleep?level=N` (level 1 when omitted; `mode`, how requests in flight end, `abort`
  when omitted): 200 with an empty body once the engine sleeps. Level 1 copies the weights to
  host memory and discards the KV cache; level 2 discards both (vllm/v1/worker/gpu_worker.py,
  `Worker.sleep`). Sleeping again is a no-op (vllm/v1/executor/abstract.py, `sleep`).
- `POST /wake_up` (repeated `tags`: `weights`, `kv_cache`; all when none): 200 with an empty
  body once the memory is back. A failure inside the engine (no memory left to take back)
  is raised through the server's exception handler: a 500 with an error body
  (vllm/entrypoints/serve/utils/server_utils.py, `exception_handler`).
- `GET /is_sleeping`: 200 with `{"is_sleeping": true|false}`.
- `POST /collective_rpc` with `{"method": "reload_weights"}` (vllm/entrypoints/serve/rpc/
  api_router.py, dev mode too): after a level 2 sleep the weights' memory comes back empty,
  so waking from level 2 is weights, reload, then the KV cache (vLLM's sleep-mode guide;
  docs/runtime.md, "Sleeping (vLLM)").

While it sleeps, vLLM pauses its scheduler (vllm/v1/engine/core.py, `EngineCore.sleep`
calls `pause_scheduler`): a request sent then is accepted and waits until a wake resumes
it. Nothing is routed to a sleeping copy for that reason; the gateway holds the request and
asks for a wake.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from cohabit.placement.residency import SleepLevel
from cohabit.runtime.errors import SleepError, SleepUnsupported

SLEEP_TIMEOUT_S = 60.0  # level 1 copies every weight to host memory first
WAKE_TIMEOUT_S = 120.0  # and back; level 2 reads the weights from disk again
STATUS_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SleepClient:
    """Sleep and wake one engine at `base_url` (no `/v1`). `transport` is the seam tests
    use (httpx.MockTransport); None: the network, proxies bypassed as for every probe."""

    base_url: str
    name: str = "engine"  # how messages name the engine (its deployment id)
    transport: httpx.BaseTransport | None = None

    def sleep(self, level: SleepLevel, *, timeout_s: float = SLEEP_TIMEOUT_S) -> None:
        """Put the engine to sleep at `level`; returns once it sleeps.

        Raises SleepUnsupported (no sleep routes), SleepError (anything else but 200).
        """
        self._post("/sleep", params={"level": str(int(level))}, timeout_s=timeout_s)

    def wake_up(self, level: SleepLevel, *, timeout_s: float = WAKE_TIMEOUT_S) -> None:
        """Wake an engine that sleeps at `level`; returns once it can serve again. From
        level 2: the weights' memory first, the weights read again, then the KV cache.

        Raises SleepUnsupported, SleepError (a wake that failed, e.g. no memory to take back).
        """
        if level is SleepLevel.OFFLOAD:
            self._post("/wake_up", timeout_s=timeout_s)
            return
        self._post("/wake_up", params={"tags": "weights"}, timeout_s=timeout_s)
        self._post("/collective_rpc", json={"method": "reload_weights"}, timeout_s=timeout_s)
        self._post("/wake_up", params={"tags": "kv_cache"}, timeout_s=timeout_s)

    def is_sleeping(self, *, timeout_s: float = STATUS_TIMEOUT_S) -> bool:
        """Whether the engine sleeps now.

        Raises SleepUnsupported, SleepError (including an answer that is not
        `{"is_sleeping": bool}`).
        """
        response = self._request("GET", "/is_sleeping", timeout_s=timeout_s)
        try:
            answer = response.json()["is_sleeping"]
        except (ValueError, KeyError, TypeError):
            answer = None
        if not isinstance(answer, bool):
            raise SleepError(
                f"{self.name}: /is_sleeping answered {response.text[:200]!r}, "
                'not {"is_sleeping": true|false}'
            )
        return answer

    def _post(
        self,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json: object = None,
        timeout_s: float,
    ) -> None:
        self._request("POST", path, params=params, json=json, timeout_s=timeout_s)

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, str] | None = None,
        json: object = None,
        timeout_s: float,
    ) -> httpx.Response:
        try:
            with httpx.Client(
                base_url=self.base_url, transport=self.transport, trust_env=False
            ) as client:
                response = client.request(method, path, params=params, json=json, timeout=timeout_s)
        except httpx.TimeoutException:
            raise SleepError(
                f"{self.name}: {method} {path} took more than {timeout_s:g} s"
            ) from None
        except httpx.HTTPError as err:
            raise SleepError(f"{self.name}: {method} {path} failed: {err}") from None
        if response.status_code == httpx.codes.NOT_FOUND:
            raise SleepUnsupported(
                f"{self.name}: no {path} route: the engine was started without sleep mode"
            )
        if response.status_code != httpx.codes.OK:
            raise SleepError(
                f"{self.name}: {method} {path} answered {response.status_code}: {_detail(response)}"
            )
        return response


def _detail(response: httpx.Response) -> str:
    """The error's own message when the body carries one (vLLM's ErrorResponse puts it under
    `error.message`, FastAPI's under `detail`), else the body's start."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200] or "no body"
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:200]
        if isinstance(body.get("detail"), str):
            return str(body["detail"])[:200]
        if isinstance(body.get("message"), str):
            return str(body["message"])[:200]
    return response.text[:200]
