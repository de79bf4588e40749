"""The input rules every edge applies (HTTP, MCP through HTTP, the Kafka intake, the CLI's
imports), each stated once: as a JSON Schema fragment that the OpenAPI document and the exported
JSON Schema files carry, and as the check that enforces exactly that fragment.

Two properties hold them together:

- **One dialect.** Patterns use explicit character classes only (no `\\s`, `\\w`, `\\d` and no
  `$` before a newline), so an ECMA-262 validator (the JSON Schema dialect) and Python's `re`
  accept the same strings.
- **New rules at the edge, never on replay.** Records already on a log were accepted under the
  rules of their day and must keep decoding: validation with `context=FROM_LOG` applies the
  older, looser rules. Everything else (requests, intake records, Python callers) gets the
  edge's.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, ValidationInfo, WithJsonSchema

FROM_LOG = {"from_log": True}
# The largest integer every JSON parser reads exactly (a float64 holds it): offsets and counts stay below.
MAX_SAFE_INT = 2**53 - 1

# What Python's str.isspace() calls whitespace, spelled out so the JSON Schema agrees with it.
WHITESPACE = "\\t\\n\\x0b\\x0c\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
# Characters no identifier, name or speaker may hold: C0 and C1 controls, DEL, and the Unicode
# bidirectional controls (they make a shown string read differently from what it is).
CONTROLS = "\\x00-\\x1f\\x7f-\\x9f\\u061c\\u200e\\u200f\\u202a-\\u202e\\u2066-\\u2069"
HAS_CONTENT = f"[^{WHITESPACE}]"

# Identifiers: printable, no controls, no '/' (ids are path segments of the API), no surrounding
# whitespace. Ids such as `conv-26:D1:3` or a UUID fit.
ID_MAX = 200
_ID_EDGE_CHAR = f"[^{CONTROLS}/{WHITESPACE}]"
ID_PATTERN = f"^{_ID_EDGE_CHAR}(?:[^{CONTROLS}/]{{0,{ID_MAX - 2}}}{_ID_EDGE_CHAR})?$"
# The rule of records already on a log: printable ASCII-control-free, no surrounding whitespace.
LOG_ID_PATTERN = r"^[^\s\x00-\x1f\x7f](?:[^\x00-\x1f\x7f]{0,198}[^\s\x00-\x1f\x7f])?$"
TENANT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
NAME_PATTERN = f"^[^{CONTROLS}]*$"

# Times: RFC 3339 with a UTC offset, written with a year in 1900-2199 (dates near the ends of
# Python's range overflow as soon as anyone adds a week to them).
TIME_PATTERN = (r"^(19|20|21)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
                r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$")
TIME_EXAMPLE = "2024-05-01T09:30:00Z"
YEAR_MIN, YEAR_MAX = 1900, 2199
# Records on a log were checked in UTC against [1900-01-01, 2200-01-01); a day either side takes
# in both that rule and the edge's (which bounds the year as written, before the offset).
LOG_TIME_MIN = datetime(1899, 12, 31, tzinfo=timezone.utc)
LOG_TIME_MAX = datetime(2200, 1, 2, tzinfo=timezone.utc)

_ID = re.compile(ID_PATTERN)
_LOG_ID = re.compile(LOG_ID_PATTERN)
_NAME = re.compile(NAME_PATTERN)
_TIME = re.compile(TIME_PATTERN)
_CONTENT = re.compile(HAS_CONTENT)


def from_log(info: ValidationInfo | None) -> bool:
    return bool(info is not None and info.context and info.context.get("from_log"))


def has_content(text: str) -> bool:
    """Whether `text` holds a character that is not whitespace (str.strip() leaves something)."""
    return _CONTENT.search(text) is not None


def check_id(value: str, info: ValidationInfo | None) -> str:
    if from_log(info):
        if not _LOG_ID.fullmatch(value):
            raise ValueError("must be 1-200 printable characters without surrounding whitespace")
        return value
    if not _ID.fullmatch(value):
        raise ValueError(f"must be 1-{ID_MAX} characters: no control or bidirectional-control characters, no '/', "
                         "no surrounding whitespace (e.g. conv-26:D1:3)")
    return value


def check_name(value: str, info: ValidationInfo | None) -> str:
    if not from_log(info) and not _NAME.fullmatch(value):
        raise ValueError("must not contain control or bidirectional-control characters")
    return value


def check_speaker(value: str, info: ValidationInfo | None) -> str:
    check_name(value, info)
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    if not has_content(value):
        raise ValueError("must not be blank")
    return value


def parse_time(value: Any, info: ValidationInfo | None) -> Any:
    """A time as the edge takes it: an RFC 3339 string (or, from Python, an aware datetime),
    never a number. From a log, anything the model's own parser reads."""
    if from_log(info) or isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not _TIME.fullmatch(value):
        raise ValueError(f"must be an RFC 3339 date-time with a UTC offset and a year in {YEAR_MIN}-{YEAR_MAX}, "
                         f"e.g. {TIME_EXAMPLE}")
    return datetime.fromisoformat(value)


def bounded_utc(value: datetime, info: ValidationInfo | None) -> datetime:
    """An aware datetime in UTC: written with a year in [YEAR_MIN, YEAR_MAX] (from a log: in
    [LOG_TIME_MIN, LOG_TIME_MAX) UTC), else ValueError saying so."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("must carry a UTC offset")
    if from_log(info):
        try:
            utc = value.astimezone(timezone.utc)
        except (OverflowError, ValueError):
            utc = None
        if utc is None or not LOG_TIME_MIN <= utc < LOG_TIME_MAX:
            raise ValueError(f"must lie between {LOG_TIME_MIN.date()} and {LOG_TIME_MAX.date()} (UTC)")
        return utc
    if not YEAR_MIN <= value.year <= YEAR_MAX:
        raise ValueError(f"must have a year in {YEAR_MIN}-{YEAR_MAX}")
    return value.astimezone(timezone.utc)


def integral(value: Any) -> Any:
    """JSON Schema's integers: a number with no fraction (`1.0`) is the integer 1. Booleans and
    strings stay what they are (refused by a strict integer)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_SAFE_INT:
        return int(value)
    return value


def check_safe_int(value: Any, info: ValidationInfo | None) -> Any:
    """At the edge, an integer outside ±MAX_SAFE_INT is refused (a JavaScript client would read
    another number); a log may hold larger ones from before this rule."""
    if isinstance(value, int) and not isinstance(value, bool) and not from_log(info) and abs(value) > MAX_SAFE_INT:
        raise ValueError(f"must lie in ±{MAX_SAFE_INT} (2^53 - 1)")
    return value


def _string(pattern: str, max_length: int | None = None, min_length: int | None = None, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "pattern": pattern}
    if min_length is not None:
        schema["minLength"] = min_length
    if max_length is not None:
        schema["maxLength"] = max_length
    return {**schema, **extra}


ID_SCHEMA = _string(ID_PATTERN, ID_MAX, 1)
TENANT_SCHEMA = _string(TENANT_PATTERN, 63, 1)
TIME_SCHEMA = {"type": "string", "format": "date-time", "pattern": TIME_PATTERN, "examples": [TIME_EXAMPLE]}

Integral = BeforeValidator(integral)
SafeInt = Annotated[int, Integral, AfterValidator(check_safe_int),
                    WithJsonSchema({"type": "integer", "minimum": -MAX_SAFE_INT, "maximum": MAX_SAFE_INT})]
Id = Annotated[str, AfterValidator(check_id), WithJsonSchema(ID_SCHEMA)]
Name = Annotated[str, AfterValidator(check_name), WithJsonSchema(_string(NAME_PATTERN, 200))]
Time = Annotated[datetime, BeforeValidator(parse_time), AfterValidator(bounded_utc), WithJsonSchema(TIME_SCHEMA)]
