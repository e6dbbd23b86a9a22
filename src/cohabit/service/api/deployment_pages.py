"""Pages of `GET /serving/deployments` as JSON, each deployment rendered once per content.

Every client that polls the list asks for nearly the same page, and ended deployments never
change again, so each deployment's JSON is kept (per process, a bounded LRU) together with
the stored content it was made from (`store.deployments.page_contents`: every column but
the lease, nothing parsed). A page then costs one index read of the contents; only records
whose content changed since, or that were never seen, are loaded and rendered again; a page
whose contents are all those of its last answer is that answer, as it was. The content
check makes the cache safe with several server processes on one database. A deployment's
content includes its active copies' (`store.deployments.active_copies`, one more index
read), since it is shown with them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from cohabit.store import deployments as store
from cohabit.store.database import Database
from cohabit.store.records import DeploymentRecord

# A deployment's JSON, from its record and its active copies, for the server root URL.
Render = Callable[[DeploymentRecord, Sequence[DeploymentRecord], str], bytes]
_Key = tuple[str, str]  # deployment id, root URL (its `endpoint` depends on it)
_PageKey = tuple[str, int, int, str | None]  # root URL, limit, offset, model id
_PAGES_KEPT = 16


class DeploymentPages:
    """`page()` answers a list request; `render(record, copies, root_url)` makes one item's
    JSON."""

    def __init__(self, render: Render, *, size: int = 4096) -> None:
        self._render = render
        self._size = size
        self._items: OrderedDict[_Key, tuple[tuple[Any, ...], bytes]] = OrderedDict()
        # The last answer of each page asked for, with the contents it was made of: polling
        # clients mostly ask for the default page while nothing on it changed.
        self._pages: OrderedDict[_PageKey, tuple[list[tuple[str, tuple[Any, ...]]], bytes]] = (
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
        rows = store.page_contents(db, limit=limit, offset=offset, model_id=model_id)
        copies = store.active_copies(db, [deployment_id for deployment_id, _ in rows])
        contents = [(i, (content, *(c for _, c in copies.get(i, ())))) for i, content in rows]
        page_key = (root_url, limit, offset, model_id)
        parts: dict[str, bytes] = {}
        with self._lock:
            last = self._pages.get(page_key)
            if last is not None and last[0] == contents:
                self._pages.move_to_end(page_key)
                return last[1]
            for deployment_id, content in contents:
                kept = self._items.get((deployment_id, root_url))
                if kept is not None and kept[0] == content:
                    self._items.move_to_end((deployment_id, root_url))
                    parts[deployment_id] = kept[1]
        missing = [deployment_id for deployment_id, _ in contents if deployment_id not in parts]
        # Read after the contents: a record changed in between is shown as it is now (and
        # kept under its new content); one purged in between is left out.
        for record, content in store.with_contents(db, missing):
            others = copies.get(record.id, ())
            parts[record.id] = self._render(record, [c for c, _ in others], root_url)
            self._keep((record.id, root_url), (content, *(c for _, c in others)), parts[record.id])
        items = [parts[deployment_id] for deployment_id, _ in contents if deployment_id in parts]
        answer = b"[" + b",".join(items) + b"]"
        if not missing:  # made of what `contents` says alone
            with self._lock:
                self._pages[page_key] = (contents, answer)
                self._pages.move_to_end(page_key)
                while len(self._pages) > _PAGES_KEPT:
                    self._pages.popitem(last=False)
        return answer

    def _keep(self, key: _Key, content: tuple[Any, ...], rendered: bytes) -> None:
        with self._lock:
            self._items[key] = (content, rendered)
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)
