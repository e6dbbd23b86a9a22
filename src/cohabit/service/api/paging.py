"""The `limit` and `offset` query parameters of the list routes, and their defaults.

Lists stay plain JSON arrays (what the published kamiwaza client parses); a caller pages by
asking again with `offset` moved on by `limit` until a page comes back shorter than `limit`.
Deployments list the active ones first, then the ended ones newest first, so the default
page holds every live deployment (while there are fewer than `DEPLOYMENTS_LIMIT`) and the
most recent history; models and configs are few, so their default page is larger.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

DEPLOYMENTS_LIMIT = 100
CATALOG_LIMIT = 1000
MAX_LIMIT = 1000
MAX_OFFSET = 2**31 - 1  # what every database takes as an OFFSET

_LIMIT = "How many items at most (1-1000)."
_OFFSET = "How many items of the full list to skip before this page."

Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description=_LIMIT)]
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET, description=_OFFSET)]
