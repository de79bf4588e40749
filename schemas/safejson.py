"""The JSON memstream accepts, wherever it comes from: an HTTP body (services/http_guard.py) or a
record on the log (events, key records, control records, whoever wrote them).

Depth at most 64, integers at most 40 digits, finite numbers only (no NaN, Infinity or 1e400), no lone surrogates (they cannot be
encoded as UTF-8, so they would fail later, deep inside a store): UnsafeJSON with the reason
otherwise. One rule for both paths, so a record a foreign producer writes straight to the log is
held to what the API would have accepted, and a hostile record costs a bounded amount of work
(Python's own parser raises RecursionError on deep nesting, and ValueError on integer literals
over 4,300 digits, neither of which a caller expects from a JSON decoder).
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 64
MAX_INT_DIGITS = 40


class UnsafeJSON(ValueError):
    """The text is JSON memstream does not accept; the message says why."""


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise UnsafeJSON(f"an integer literal has {len(text.lstrip('-'))} digits; at most {MAX_INT_DIGITS} are accepted")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses as inf
        raise UnsafeJSON(f"the number {text[:40]} is too large for a double (numbers must be finite)")
    return value


def _constant(name: str):
    raise UnsafeJSON(f"{name} is not valid JSON (numbers must be finite)")


def _check_string(s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsafeJSON("a string holds a lone surrogate (\\ud800-\\udfff escape without its pair), which is not valid Unicode") from None


def _walk(value: Any) -> None:
    """Depth and strings, without recursion (a deep document must not exhaust the stack here either)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            _check_string(v)
        elif isinstance(v, (dict, list)):
            if depth > MAX_DEPTH:
                raise UnsafeJSON(f"the document is nested more than {MAX_DEPTH} levels deep")
            if isinstance(v, dict):
                for k, x in v.items():
                    _check_string(k)
                    stack.append((x, depth + 1))
            else:
                stack.extend((x, depth + 1) for x in v)


def loads(text: str) -> Any:
    """json.loads with memstream's limits (raises UnsafeJSON or json.JSONDecodeError)."""
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except RecursionError:
        raise UnsafeJSON(f"the document is nested more than {MAX_DEPTH} levels deep") from None
    _walk(value)
    return value
