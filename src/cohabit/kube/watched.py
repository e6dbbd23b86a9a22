"""What the operator reads for every decision — the pods it counts and the nodes it places
on — kept in memory by watches instead of listed each time: with 200 nodes and a thousand
engine pods, the two lists were megabytes per decision (docs/benchmarks.md).

`WatchedPort` is a `KubernetesPort` whose `list_pods`, `get_pod` and `list_nodes` answer
from a list, then a watch from that list's version (what client-go's reflector does).

Pods are never older than what a read must include:
- every pod write this port made: its create, delete and gate release (the API server's
  answer names the version it wrote);
- the version a caller names (`seen`): the event a handler acts on, the ModelDeployment a
  decision is for. A write before that one, by anyone, is then in the answer.
A read waits for the watch to pass that version; when it has not within `CATCH_UP_S` (pods
may not change at all after the version another resource was given) the read lists afresh,
as a port without a watch does. A read of one pod the watch has not caught up with waits for
nothing: it reads that pod from the API server, which answers with what is there now.
Versions are compared as numbers (`versions`).

Nodes are as their watch last delivered them, the way the scheduler's informers hold them:
the operator never writes one, and a node's version says nothing of a ModelDeployment's.
A read with `listed_since` (a `time.monotonic()`) lists afresh unless a list begun since
then is held: a decision that finds no room confirms it on lists begun after it began
(`controller`), so a node added a moment before is not missed, and pods the decision
already listed afresh are not listed again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import urllib3
from kubernetes import client

from cohabit.kube.cluster import KubernetesPort, key_of
from cohabit.kube.errors import ClusterError
from cohabit.kube.versions import version_number

CATCH_UP_S = 0.25  # how long a read waits for the watch before it lists afresh
WATCH_TIMEOUT_S = 240  # each watch call ends after this long and goes on from where it was
RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)  # waits before listing again after a broken watch
_GONE = 410  # the watch's version is too old to go on from: list again
_GONE_KEPT = 4096  # uids of objects dropped, whose DELETED event has yet to come

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name); a node's namespace is ""
Listing = tuple[list[dict[str, Any]], str]  # the items, and the version to watch from


class Watch:
    """One kind's objects, held from a list then a watch, on a thread of its own. Until the
    first list is in, a read lists afresh."""

    def __init__(
        self,
        what: str,
        list_them: Callable[[], Listing],
        watch_them: Callable[[str, int], Any],
    ) -> None:
        self.what = what
        self._list_them = list_them
        self._watch_them = watch_them
        self._changed = threading.Condition()
        self._items: dict[Key, dict[str, Any]] = {}
        # Objects a write's answer said are gone, by uid, until their DELETED event: an
        # event of theirs from before the deletion, delivered after it, must not bring them
        # back (a uid is never used again).
        self._gone: dict[str, None] = {}
        self._version = -1  # the newest version the list or the watch delivered
        self._written = -1  # the newest version of a write made through the port
        self._listed = False
        self._listed_at = float("-inf")  # when the list held began (time.monotonic())
        self._stop = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=f"{what}-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            # The watch call may be ending meanwhile, its socket closed by its own thread.
            with contextlib.suppress(OSError):
                getattr(response, "shutdown", response.close)()  # urllib3 2.3 has shutdown
        self._thread.join(10)

    @contextmanager
    def held(
        self, seen: str | None = None, *, listed_since: float | None = None
    ) -> Iterator[dict[Key, Any]]:
        """The objects held, by key, including every write through the port and every
        write up to `seen`, and from a list begun no earlier than `listed_since` (see the
        module). Read them inside the `with`: the watch waits meanwhile."""
        with self._changed:
            stale = listed_since is not None and self._listed_at < listed_since
            if stale or not self._caught_up(seen):
                self._relist()
            yield self._items

    def includes(self, seen: str | None) -> bool:
        """Whether what is held now includes every write through the port and every write
        up to `seen`, without waiting."""
        with self._changed:
            return self._holds(max(self._written, version_number(seen)))

    def _holds(self, version: int) -> bool:
        """Whether the list is in and the watch has passed `version` (holding `_changed`)."""
        return self._listed and self._version >= version

    def wrote(self, answer: Mapping[str, Any] | None) -> None:
        """A write's answer. One that names no version (an object already gone) leaves
        what reads must include as it was: the watch reports that deletion in its turn."""
        version = version_number(((answer or {}).get("metadata") or {}).get("resourceVersion"))
        with self._changed:
            self._written = max(self._written, version)

    def drop(self, key: Key, uid: str = "") -> None:
        """Forget an object a write's answer says is gone (`uid`: that object's, else the
        one held); neither an older event of it the watch delivers after this nor its
        DELETED event changes anything more."""
        with self._changed:
            held = self._items.pop(key, None)
            uid = uid or _uid(held or {})
            if uid:
                self._gone[uid] = None
                while len(self._gone) > _GONE_KEPT:
                    del self._gone[next(iter(self._gone))]

    def _caught_up(self, seen: str | None) -> bool:
        """Whether the objects held include every write through the port and every write up
        to `seen`, waiting for the watch at most CATCH_UP_S. Called holding `_changed`."""
        wanted = max(self._written, version_number(seen))
        return self._changed.wait_for(lambda: self._holds(wanted), timeout=CATCH_UP_S)

    def _relist(self) -> None:
        """Hold what a list now says (called holding `_changed`). The watch goes on where
        it was: `_apply` passes over what it delivers of versions the list already holds."""
        began = time.monotonic()
        items, version = self._list_them()
        self._hold_newer(items, version, began)

    def _hold_newer(self, items: list[dict[str, Any]], version: str, began: float) -> None:
        """Hold a list unless what is held is newer (another list, or the watch, passed it
        meanwhile); when it holds, when the list held began never moves back (called holding
        `_changed`)."""
        if version_number(version) > self._version or not self._listed:
            self._hold(items, version, max(began, self._listed_at))
        else:  # what is held is no older than this list
            self._listed_at = max(began, self._listed_at)

    def _hold(self, items: list[dict[str, Any]], version: str, began: float) -> None:
        self._items = {key_of(obj): obj for obj in items if _uid(obj) not in self._gone}
        self._version = version_number(version)
        self._listed = True
        self._listed_at = began
        self._changed.notify_all()

    # --- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                began = time.monotonic()
                items, version = self._list_them()
                with self._changed:
                    self._hold_newer(items, version, began)
                failures = 0
                self._watch(version)
            except Exception as error:  # the thread must go on: what it holds would age
                if self._stop.is_set():
                    return
                delay = RETRY_S[min(failures, len(RETRY_S) - 1)]
                failures += 1
                if isinstance(error, ClusterError):
                    log.warning("watching %s: %s; listing again in %.1f s", self.what, error, delay)
                else:
                    log.exception("watching %s failed; listing again in %.1f s", self.what, delay)
                self._stop.wait(delay)

    def _watch(self, version: str) -> None:
        """Events from `version` on, over as many watch calls as it takes; returns (for a
        new list) when the version has expired."""
        while not self._stop.is_set():
            self._response = self._watch_them(version, WATCH_TIMEOUT_S)
            try:
                for event in self._events(self._response):
                    obj = event.get("object") or {}
                    if event.get("type") == "ERROR":
                        if obj.get("code") == _GONE:
                            return
                        raise ClusterError(f"watch {self.what}: {obj.get('message') or obj}")
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    self._apply(str(event.get("type")), obj)
            finally:
                self._response.release_conn()
                self._response = None

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        """One event; a BOOKMARK only moves the version on."""
        version = version_number((obj.get("metadata") or {}).get("resourceVersion"))
        with self._changed:
            if version <= self._version:
                return  # a list since then holds it (or what came after it)
            if kind == "DELETED":
                self._items.pop(key_of(obj), None)
                self._gone.pop(_uid(obj), None)
            elif kind in ("ADDED", "MODIFIED") and _uid(obj) not in self._gone:
                self._items[key_of(obj)] = obj
            self._version = version
            self._changed.notify_all()

    def _events(self, response: Any) -> Iterator[dict[str, Any]]:
        """A watch response's events, one JSON object per line."""
        try:
            for line in response:
                if line.strip():
                    yield json.loads(line)
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise ClusterError(f"watch {self.what}: the watch broke off: {error}") from None


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


class WatchedPort(KubernetesPort):
    """A `KubernetesPort` reading the nodes it may place on, and the pods of `namespace`
    (None: every namespace), from watches (see the module). `start()` before use."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        namespace: str | None,
        node_selector: str = "",
        claims: bool = False,
    ) -> None:
        super().__init__(api, node_selector=node_selector)
        self.namespace = namespace
        # Every namespace's ResourceClaims too, with the DRA backend (`claims`).
        self.claims: Watch | None = None
        if claims:
            self.claims = Watch(
                "resourceclaims",
                self.claims_and_version,
                self.listed_claims().watch,
            )
        self.pods = Watch(
            "pods",
            lambda: self.pods_and_version(namespace),
            self.listed_pods(namespace).watch,
        )
        self.nodes = Watch(
            "nodes",
            self.nodes_and_version,
            self.listed_nodes().watch,
        )

    def start(self) -> None:
        self.pods.start()
        self.nodes.start()
        if self.claims is not None:
            self.claims.start()

    def stop(self) -> None:
        self.pods.stop()
        self.nodes.stop()
        if self.claims is not None:
            self.claims.stop()

    # --- reads ------------------------------------------------------------------------

    def list_nodes(self, *, listed_since: float | None = None) -> list[dict[str, Any]]:
        with self.nodes.held(listed_since=listed_since) as nodes:
            return list(nodes.values())

    def list_claims(self, *, listed_since: float | None = None) -> list[dict[str, Any]]:
        if self.claims is None:
            return super().list_claims()
        with self.claims.held(listed_since=listed_since) as claims:
            return list(claims.values())

    def list_pods(
        self,
        namespace: str | None,
        *,
        seen: str | None = None,
        listed_since: float | None = None,
    ) -> list[dict[str, Any]]:
        if not self._covers(namespace):
            return super().list_pods(namespace)
        assumed = self.assumed(namespace)  # first (see `assumed`)
        with self.pods.held(seen, listed_since=listed_since) as pods:
            return [pod for key, pod in pods.items() if namespace in (None, key[0])] + assumed

    def get_pod(
        self, namespace: str, name: str, *, seen: str | None = None
    ) -> dict[str, Any] | None:
        if not self._covers(namespace) or not self.pods.includes(seen):
            # One pod read now is no older than `seen`: on a quiet cluster the watch may not
            # pass it for minutes, and waiting, then listing every pod, is for a list.
            return super().get_pod(namespace, name)
        with self.pods.held(seen) as pods:
            found: dict[str, Any] | None = pods.get((namespace, name))
            return found

    def _covers(self, namespace: str | None) -> bool:
        return self.namespace is None or namespace == self.namespace

    # --- writes: what the API server answers says which version a read must include ----

    def create(self, body: Mapping[str, Any]) -> None:
        answer = self._create(body)
        if body.get("kind") == "Pod":
            self.pods.wrote(answer)

    def delete_pod(self, namespace: str, name: str) -> None:
        answer = self._delete_pod(namespace, name)
        self.pods.wrote(answer)
        meta = (answer or {}).get("metadata") or {}
        at_once = meta.get("deletionGracePeriodSeconds") == 0 and not meta.get("finalizers")
        if not meta.get("deletionTimestamp") or at_once:
            # Removed at once (never bound: the answer carries a grace period of 0), or
            # gone already (no answer): the answer says so before the watch does.
            self.pods.drop((namespace, name), _uid(answer or {}))

    def open_gate(self, namespace: str, name: str) -> None:
        self.pods.wrote(self._open_gate(namespace, name))
