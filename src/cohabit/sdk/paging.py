"""Reading a list route to its end, for both clients: the server answers at most `limit` items
from `offset` on, and a page shorter than `limit` is the last (the service's api/paging.py).
`Walk` says which page to ask for next and when the list is done; `every` and `every_async`
run it, one request per page, as the caller iterates.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from cohabit.sdk.http import AsyncHttpSession, Call, HttpSession

T = TypeVar("T")

# The server's largest `limit`: the fewest round trips for a whole list.
PAGE_SIZE = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class Page:
    """Which part of a list to ask for: at most `limit` items, after skipping `offset`."""

    limit: int
    offset: int = 0

    def params(self) -> dict[str, str]:
        return {"limit": str(self.limit), "offset": str(self.offset)}


PageCall = Callable[[Page], Call[list[T]]]


@dataclass(slots=True, kw_only=True)
class Walk(Generic[T]):
    """One walk over a list: run `next_call()`, hand its answer to `take`, until `done`.
    Offsets count the items read, so a list that changes while it is read (a deployment that
    ends moves from the active ones at the front to the ended ones) may shift one item
    across a page boundary: that item is then missed or read twice."""

    call: PageCall[T]
    page_size: int = PAGE_SIZE
    offset: int = 0
    done: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.page_size <= PAGE_SIZE:
            raise ValueError(f"page_size must be 1-{PAGE_SIZE}, got {self.page_size}")

    def next_call(self) -> Call[list[T]]:
        return self.call(Page(limit=self.page_size, offset=self.offset))

    def take(self, items: list[T]) -> list[T]:
        self.offset += len(items)
        self.done = len(items) < self.page_size
        return items


def every(http: HttpSession, call: PageCall[T], *, page_size: int = PAGE_SIZE) -> Iterator[T]:
    """Every item of the list `call` pages, read `page_size` at a time as they are used."""
    walk = Walk(call=call, page_size=page_size)  # checked now, not at the first item
    return _walk(http, walk)


def _walk(http: HttpSession, walk: Walk[T]) -> Iterator[T]:
    while not walk.done:
        yield from walk.take(http.run(walk.next_call()))


def every_async(
    http: AsyncHttpSession, call: PageCall[T], *, page_size: int = PAGE_SIZE
) -> AsyncIterator[T]:
    """`every`, awaited: an async iterator."""
    walk = Walk(call=call, page_size=page_size)
    return _walk_async(http, walk)


async def _walk_async(http: AsyncHttpSession, walk: Walk[T]) -> AsyncIterator[T]:
    while not walk.done:
        for item in walk.take(await http.run(walk.next_call())):
            yield item
