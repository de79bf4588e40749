"""Mem0's `filters`, as mem0ai 2.2.1 defines them, evaluated here on each memory's stored fields.

memstream's search and listing take a boundary (conversation, session, agent); the rest of a
filter is applied by the client to what they return. The grammar (mem0ai 2.2.1's `Memory.search`
docstring and its default vector store's reading of it):

- `{"field": value}` equals; `{"field": [a, b]}` is one of them; `{"field": "*"}`: the field is
  present (not null).
- `{"field": {op: operand, …}}` with `eq`, `ne`, `gt`, `gte`, `lt`, `lte`, `in`, `nin`, `contains`
  (case-sensitive substring), `icontains` (case-insensitive); several operators all apply. `ne`
  and `nin` hold for a memory without the field. `gt`…`lte` compare numbers, or dates and times
  given in ISO 8601 (a date alone is its midnight, UTC unless an offset is given); a value of
  another kind does not match. Equality never takes a bool for a number.
- `{"AND": [filter, …]}` all, `{"OR": [filter, …]}` any (non-empty), `{"NOT": [filter, …]}` none
  (non-empty); nested freely. Several keys in one dict all apply.
- Fields are the memory's metadata keys, `user_id`, `agent_id`, `run_id`, `actor_id`, `role`,
  `created_at`, `updated_at`, `data` (the text) and `hash`, as in Mem0's payload.

Any other operator, or a logical operator without a list, is a ValidationError naming it — the
ValueError mem0ai raises. The platform surface (`MemoryClient`) also takes its documented forms:
identity inside a root `AND`, `NOT` of one filter, `{"metadata": {key: condition}}`,
`{"keywords": {"contains"|"icontains": text}}` on the text and `{"memory_ids": [id, …]}`;
`categories`, `app_id` and `timestamp` are refused by name (memstream has no categories, apps or
separate timestamps).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

from memstream_client.compat.mem0.errors import ValidationError

IDS = ("user_id", "agent_id", "run_id")
OPERATORS = ("eq", "ne", "gt", "gte", "lt", "lte", "in", "nin", "contains", "icontains")
RANGES = ("gt", "gte", "lt", "lte")
LOGICAL = ("AND", "OR", "NOT")
PLATFORM_REFUSED = {
    "categories": "memstream assigns no categories to memories (filter on your own metadata instead)",
    "app_id": "memstream has no apps: a key's tenant is the widest scope",
    "timestamp": "memstream has one time per memory: filter on created_at or updated_at",
}

Record = Mapping[str, Any]
Test = Callable[[Record], bool]


@dataclass(frozen=True)
class Filters:
    """A parsed filter: `ids` are the plain user/agent/run ids that bound the server's search or
    listing; `test` holds every condition (those ids too, checked on what is stored); `narrows`
    says whether anything beyond those ids remains, which the client applies to over-fetched
    candidates."""

    ids: dict[str, str]
    test: Test
    narrows: bool


def checked_id(name: str, value: Any) -> str:
    """An entity id as mem0ai takes it: coerced to str, trimmed, non-empty, no whitespace."""
    value = str(value).strip()
    if not value:
        raise ValidationError(f"Invalid {name}: cannot be empty or whitespace-only. Provide a valid identifier.")
    if any(c.isspace() for c in value):
        raise ValidationError(f"Invalid {name}: cannot contain whitespace. Provide a valid identifier without spaces.")
    return value


def parse(filters: Any, *, platform: bool = False, require_id: bool = True) -> Filters:
    """`filters` checked and compiled; `require_id`: at least one of user_id, agent_id, run_id at
    the top (mem0ai's `Memory.search` and `get_all` refuse a filter without one)."""
    if filters is None:
        filters = {}
    if not isinstance(filters, dict):
        raise ValidationError(f"filters must be a dict, not {type(filters).__name__}")
    if require_id and not any(filters.get(k) is not None for k in IDS):
        raise ValidationError("filters must contain at least one of: user_id, agent_id, run_id. "
                              "Example: filters={'user_id': 'u1'}")
    ids = {k: checked_id(k, v) for k, v in filters.items() if k in IDS and _plain(v)}
    rest = {k: v for k, v in filters.items() if k not in ids}
    if platform and set(rest) == {"AND"} and isinstance(rest["AND"], list):  # {"AND": [{"user_id": "u"}, …]}
        kept = []
        for condition in rest["AND"]:
            if isinstance(condition, dict) and len(condition) == 1:
                [(key, value)] = condition.items()
                if key in IDS and _plain(value) and key not in ids:
                    ids[key] = checked_id(key, value)
                    continue
            kept.append(condition)
        rest = {"AND": kept} if kept else {}
    test = _compile({**rest, **ids}, platform, "filters")  # the ids as checked: trimmed, strings
    return Filters(ids, test, narrows=bool(rest))


def _plain(value: Any) -> bool:
    return value is not None and not isinstance(value, (dict, list, tuple)) and value != "*"


def _compile(filters: Any, platform: bool, where: str) -> Test:
    if not isinstance(filters, dict):
        raise ValidationError(f"{where}: a filter is a dict of conditions, not {type(filters).__name__}")
    tests = [_logical(k, v, platform, where) if k in LOGICAL else _field(k, v, platform, where)
             for k, v in filters.items()]
    return lambda record: all(t(record) for t in tests)


def _logical(op: str, value: Any, platform: bool, where: str) -> Test:
    if op == "NOT" and platform and isinstance(value, dict):  # the platform's {"NOT": {…}}
        value = [value]
    if not isinstance(value, list) or (op != "AND" and not value):
        raise ValidationError(f"{where}: {op} takes a {'' if op == 'AND' else 'non-empty '}list of filter dicts")
    subs = [_compile(v, platform, f"{where}.{op}[{i}]") for i, v in enumerate(value)]
    if op == "AND":
        return lambda record: all(s(record) for s in subs)
    if op == "OR":
        return lambda record: any(s(record) for s in subs)
    return lambda record: not any(s(record) for s in subs)


def _field(key: str, condition: Any, platform: bool, where: str) -> Test:
    if platform and key in PLATFORM_REFUSED:
        raise ValidationError(f"{where}: the filter field {key!r} is not supported: {PLATFORM_REFUSED[key]}")
    if platform and key == "metadata":
        inner = _compile(condition, False, f"{where}.metadata")
        return lambda record: inner(record.get("metadata") or {})
    if condition == "*":
        return lambda record: record.get(key) is not None
    if isinstance(condition, (list, tuple)):
        return _operator(key, "in", list(condition), where)
    if isinstance(condition, dict):
        unknown = [op for op in condition if op not in OPERATORS]
        if unknown or not condition:
            named = ", ".join(map(str, unknown)) or "{}"
            raise ValidationError(f"{where}: Unsupported metadata filter operator: {named} (on {key!r}; supported: "
                                  f"{', '.join(OPERATORS)}, AND, OR, NOT, '*')")
        tests = [_operator(key, op, operand, where) for op, operand in condition.items()]
        return lambda record: all(t(record) for t in tests)
    return _operator(key, "eq", condition, where)


def _operator(key: str, op: str, operand: Any, where: str) -> Test:
    if op == "eq":
        return lambda record: key in record and _equal(record[key], operand)
    if op == "ne":
        return lambda record: not (key in record and _equal(record[key], operand))
    if op in ("in", "nin"):
        if not isinstance(operand, (list, tuple)):
            raise ValidationError(f"{where}: {key!r}: {op} takes a list, not {type(operand).__name__}")
        found: Test = lambda record: key in record and any(_equal(record[key], o) for o in operand)  # noqa: E731
        return found if op == "in" else (lambda record: not found(record))
    if op in ("contains", "icontains"):
        if not isinstance(operand, str):
            raise ValidationError(f"{where}: {key!r}: {op} takes a string, not {type(operand).__name__}")
        fold = str.casefold if op == "icontains" else (lambda s: s)
        needle = fold(operand)
        return lambda record: isinstance(record.get(key), str) and needle in fold(record[key])
    bound = _orderable(operand)
    if bound is None:
        raise ValidationError(f"{where}: {key!r}: {op} takes a number or an ISO 8601 date/time, not {operand!r}")
    compare = {"gt": lambda a, b: a > b, "gte": lambda a, b: a >= b, "lt": lambda a, b: a < b,
               "lte": lambda a, b: a <= b}[op]

    def ranged(record: Record) -> bool:
        value = _orderable(record.get(key))
        return value is not None and type(value) is type(bound) and compare(value, bound)

    return ranged


def _equal(value: Any, wanted: Any) -> bool:
    if isinstance(value, bool) or isinstance(wanted, bool):
        return isinstance(value, bool) and isinstance(wanted, bool) and value == wanted
    if isinstance(value, (int, float)) and isinstance(wanted, (int, float)):
        return value == wanted
    return type(value) is type(wanted) and value == wanted


def _orderable(value: Any) -> float | datetime | None:
    """A number as a float, an ISO 8601 date/time as an aware datetime; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
        return when if when.tzinfo else when.replace(tzinfo=timezone.utc)
    return None
