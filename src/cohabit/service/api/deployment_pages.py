"""Pages of `GET /serving/deployments` as JSON, each deployment rendered once per revision.

Every client that polls the list asks for nearly the same page, and ended deployments never
change again, so each deployment's JSON is kept (per process, a bounded LRU) together with
the revision of the record it was made from (every write to a deployment but its lease's
bumps it: `store.tables.DeploymentRow.revision`). A page then costs one index read of its
ids and revisions; only records whose revision changed since, or that were never seen, are
loaded and rendered again; a page whose revisions are all those of its last answer is that
answer, as it was. The check against the database makes the cache safe with several server
processes on one database. A deployment is shown with its active copies, so its key is its
revision with its copies' ids and revisions (`store.deployments.copy_revisions`, one more
index read, made only when a deployment on the page can have copies). A deployment whose
JSON changes without its record (`live`: one loading, whose progress is read from its
timeline) is made afresh at every page and never kept.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

from cohabit.store import deployments as store
from cohabit.store.database import Database
from cohabit.store.records import DeploymentRecord

# A deployment's JSON, from its record and its active copies, for the server root URL.
Render = Callable[[Database, DeploymentRecord, Sequence[DeploymentRecord], str], bytes]
_Key = tuple[str, str]  # deployment id, root URL (its `endpoint` depends on it)
_PageKey = tuple[str, int, int, str | None]  # root URL, limit, offset, model id
_PAGES_KEPT = 16
# What a rendering is kept under: the deployment's revision, and its active copies' (id,
# revision) by copy index (empty for one without copies).
_Revision = tuple[int, tuple[tuple[str, int], ...]]


class DeploymentPages:
    """`page()` answers a list request; `render(record, copies, root_url)` makes one item's
    JSON."""

    def __init__(
        self,
        render: Render,
        *,
        size: int = 4096,
        live: Callable[[DeploymentRecord], bool] = lambda _record: False,
    ) -> None:
        self._render = render
        self._live = live
        self._size = size
        self._items: OrderedDict[_Key, tuple[_Revision, bytes]] = OrderedDict()
        # The last answer of each page asked for, with the revisions it was made of: polling
        # clients mostly ask for the default page while nothing on it changed.
        self._pages: OrderedDict[_PageKey, tuple[list[tuple[str, _Revision]], bytes]] = (
            OrderedDict()
        )
        self._lock = threading.Lock()

    def page(
        self,
        db: Database,
        *,
        root_url: str,
        limit: int,
        offset: int = 0,
        model_id: str | None = None,
    ) -> bytes:
        """The page as a JSON array (the order of `store.deployments.page`)."""
        entries = store.page_revisions(db, limit=limit, offset=offset, model_id=model_id)
        flagged = [e.id for e in entries if e.copied]
        copied = store.copy_revisions(db, flagged)
        keys = [(e.id, (e.revision, copied.get(e.id, ()))) for e in entries]
        page_key = (root_url, limit, offset, model_id)
        parts: dict[str, bytes] = {}
        with self._lock:
            last = self._pages.get(page_key)
            if last is not None and last[0] == keys:
                self._pages.move_to_end(page_key)
                return last[1]
            for deployment_id, key in keys:
                kept = self._items.get((deployment_id, root_url))
                if kept is not None and kept[0] == key:
                    self._items.move_to_end((deployment_id, root_url))
                    parts[deployment_id] = kept[1]
        missing = [deployment_id for deployment_id, _ in keys if deployment_id not in parts]
        # Read after the revisions: a record changed in between is shown as it is now (and
        # kept under its new revision); one purged in between is left out.
        copies = store.active_copies(db, [i for i in missing if i in flagged])
        for record, revision in store.with_revisions(db, missing):
            others = copies.get(record.id, ())
            parts[record.id] = self._render(db, record, [c for c, _ in others], root_url)
            if self._live(record):  # never kept: the page is then made again too
                continue
            key = (revision, tuple((c.id, r) for c, r in others))
            self._keep((record.id, root_url), key, parts[record.id])
        items = [parts[deployment_id] for deployment_id, _ in keys if deployment_id in parts]
        answer = b"[" + b",".join(items) + b"]"
        if not missing:  # made of what `keys` says alone
            with self._lock:
                self._pages[page_key] = (keys, answer)
                self._pages.move_to_end(page_key)
                while len(self._pages) > _PAGES_KEPT:
                    self._pages.popitem(last=False)
        return answer

    def _keep(self, key: _Key, revision: _Revision, rendered: bytes) -> None:
        with self._lock:
            self._items[key] = (revision, rendered)
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)
