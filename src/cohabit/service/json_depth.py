"""How deep a JSON text nests its arrays and objects, found without parsing it, so a body is
refused before a recursive parser (json.loads, pydantic, an engine's) meets it. Used by the
body check at the edge (service/api/limits.py) and by the gateway where it parses a body."""

from __future__ import annotations

import re
from itertools import accumulate

# The most levels of arrays and objects a request body may nest (the top-level object is one);
# free-form objects inside a body are held to fewer (api/fields.py), OpenAI bodies with a
# tool's JSON schema rarely pass ten.
JSON_DEPTH_LIMIT = 64

# A JSON string (RFC 8259 §7), escapes included; the unrolled form runs in sre's fast loop.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = bytes(sorted(set(range(256)) - set(b"[]{}")))
_STEP = [0] * 256
for _opener in b"[{":
    _STEP[_opener] = 1
for _closer in b"]}":
    _STEP[_closer] = -1


def depth_over(text: bytes, limit: int = JSON_DEPTH_LIMIT) -> int | None:
    """The depth `text` nests arrays and objects to when it is more than `limit`, else None.
    Brackets inside strings do not count; text that is not JSON gets an answer too (its
    parser refuses it afterwards).

    Cheap for what clients send: a text with no more brackets than `limit` cannot nest deeper
    (two byte counts, no walk); otherwise its strings are cut out and the brackets left are
    walked once, in C (`accumulate`), about 40 ns each.

    >>> depth_over(b'{"messages": [{"content": "[[[[["}]}', 2), depth_over(b"[[[[]]]]", 3)
    (None, 4)
    """
    if text.count(b"[") + text.count(b"{") <= limit:
        return None
    brackets = _STRING.sub(b"", text).translate(None, _NOT_BRACKET)
    depth = max(accumulate(map(_STEP.__getitem__, brackets)), default=0)
    return depth if depth > limit else None


def too_deep_message(depth: int, limit: int = JSON_DEPTH_LIMIT) -> str:
    """The one sentence both refusals (the API's and the gateway's) carry."""
    return f"the JSON body nests {depth} levels deep; at most {limit} are accepted"
