"""The pods the operator counts, kept in memory by a watch instead of listed for every
decision: with a thousand engine pods a list is megabytes, each time (docs/benchmarks.md).

`WatchedPods` is a `KubernetesPort` whose `list_pods` and `get_pod` answer from a list, then
a watch from that list's version (what client-go's reflector does), and are never older than
what they must include:
- every pod write this port made: its create, delete and gate release (the API server's
  answer names the version it wrote);
- the version a caller names (`seen`): the event a handler acts on, the ModelDeployment a
  decision is for. A write before that one, by anyone, is then in the answer.
A read waits for the watch to pass that version; when it has not within `CATCH_UP_S` (pods
may not change at all after the version another resource was given) the read lists afresh,
as a port without a watch does. Versions are compared as numbers (`versions`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import urllib3
from kubernetes import client

from cohabit.kube.cluster import KubernetesPort
from cohabit.kube.errors import ClusterError
from cohabit.kube.versions import version_number

CATCH_UP_S = 0.25  # how long a read waits for the watch before it lists afresh
WATCH_TIMEOUT_S = 240  # each watch call ends after this long and goes on from where it was
RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)  # waits before listing again after a broken watch
_GONE = 410  # the watch's version is too old to go on from: list again

log = logging.getLogger(__name__)

PodKey = tuple[str, str]  # (namespace, name)


def _key(pod: Mapping[str, Any]) -> PodKey:
    meta = pod.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


class WatchedPods(KubernetesPort):
    """A `KubernetesPort` reading the pods of `namespace` (None: every namespace) from a
    watch (see the module). `start()` before use; until the first list, reads list afresh."""

    def __init__(
        self, api: client.ApiClient, *, namespace: str | None, node_selector: str = ""
    ) -> None:
        super().__init__(api, node_selector=node_selector)
        self.namespace = namespace
        self._changed = threading.Condition()
        self._pods: dict[PodKey, dict[str, Any]] = {}
        self._version = -1  # the newest version the list or the watch delivered
        self._written = -1  # the newest version of a pod write made through this port
        self._listed = False
        self._stop = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            getattr(response, "shutdown", response.close)()  # urllib3 2.3 has shutdown
        self._thread.join(10)

    # --- reads ------------------------------------------------------------------------

    def list_pods(self, namespace: str | None, *, seen: str | None = None) -> list[dict[str, Any]]:
        if not self._covers(namespace):
            return super().list_pods(namespace)
        with self._changed:
            if not self._caught_up(seen):
                self._relist()
            return [pod for key, pod in self._pods.items() if namespace in (None, key[0])]

    def get_pod(
        self, namespace: str, name: str, *, seen: str | None = None
    ) -> dict[str, Any] | None:
        if not self._covers(namespace):
            return super().get_pod(namespace, name)
        with self._changed:
            if not self._caught_up(seen):
                self._relist()
            return self._pods.get((namespace, name))

    def _covers(self, namespace: str | None) -> bool:
        return self.namespace is None or namespace == self.namespace

    def _caught_up(self, seen: str | None) -> bool:
        """Whether the pods held include every pod write this port made and every write up
        to `seen`, waiting for the watch at most CATCH_UP_S. Called holding `_changed`."""
        wanted = max(self._written, version_number(seen))
        return self._changed.wait_for(
            lambda: self._listed and self._version >= wanted, timeout=CATCH_UP_S
        )

    def _relist(self) -> None:
        """Hold what a list now says (called holding `_changed`). The watch goes on where
        it was: `_apply` passes over what it delivers of versions the list already holds."""
        items, version = self.pods_and_version(self.namespace)
        if version_number(version) > self._version or not self._listed:
            self._hold(items, version)

    def _hold(self, items: list[dict[str, Any]], version: str) -> None:
        self._pods = {_key(pod): pod for pod in items}
        self._version = version_number(version)
        self._listed = True
        self._changed.notify_all()

    # --- writes: what the API server answers says which version a read must include ----

    def create(self, body: Mapping[str, Any]) -> None:
        self._wrote(self._create(body))

    def delete_pod(self, namespace: str, name: str) -> None:
        self._wrote(self._delete_pod(namespace, name))

    def open_gate(self, namespace: str, name: str) -> None:
        self._wrote(self._open_gate(namespace, name))

    def _wrote(self, answer: Mapping[str, Any] | None) -> None:
        """A pod write's answer. One that names no version (a pod already gone) leaves what
        reads must include as it was: the watch reports that pod's deletion in its turn."""
        version = version_number(((answer or {}).get("metadata") or {}).get("resourceVersion"))
        with self._changed:
            self._written = max(self._written, version)

    # --- the watch --------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                version = self._list()
                failures = 0
                self._watch(version)
            except Exception as error:  # the thread must go on: what it holds would age
                if self._stop.is_set():
                    return
                delay = RETRY_S[min(failures, len(RETRY_S) - 1)]
                failures += 1
                if isinstance(error, ClusterError):
                    log.warning("watching pods: %s; listing again in %.1f s", error, delay)
                else:
                    log.exception("watching pods failed; listing again in %.1f s", delay)
                self._stop.wait(delay)

    def _list(self) -> str:
        items, version = self.pods_and_version(self.namespace)
        with self._changed:
            self._hold(items, version)
        return version

    def _watch(self, version: str) -> None:
        """Events from `version` on, over as many watch calls as it takes; returns (for a
        new list) when the version has expired."""
        while not self._stop.is_set():
            self._response = self.watch_pods(self.namespace, version, timeout_s=WATCH_TIMEOUT_S)
            try:
                for event in _events(self._response):
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        if obj.get("code") == _GONE:
                            return
                        raise ClusterError(f"watch pods: {obj.get('message') or obj}")
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    self._apply(str(event.get("type")), obj)
            finally:
                self._response.release_conn()
                self._response = None

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        version = version_number((obj.get("metadata") or {}).get("resourceVersion"))
        with self._changed:
            if version <= self._version:
                return  # a list since then holds it (or what came after it)
            if kind == "DELETED":
                self._pods.pop(_key(obj), None)
            elif kind in ("ADDED", "MODIFIED"):
                self._pods[_key(obj)] = obj
            self._version = version
            self._changed.notify_all()


def _events(response: Any) -> Iterator[dict[str, Any]]:
    """A watch response's events, one JSON object per line."""
    try:
        for line in response:
            if line.strip():
                yield json.loads(line)
    except (urllib3.exceptions.HTTPError, OSError) as error:
        raise ClusterError(f"watch pods: the watch broke off: {error}") from None
