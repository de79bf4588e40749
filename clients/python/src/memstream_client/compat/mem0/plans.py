"""Mem0's operations on memstream, each written once as a plan: a generator that yields the
memstream calls it needs (a `Step`: a `Client` method and its arguments, or a list of steps to
make together) and returns Mem0's result, with no I/O of its own. `run` carries a plan out with a
blocking `Client`, `arun` with an `AsyncClient` (a list's steps concurrently), so `Memory`,
`AsyncMemory`, `MemoryClient` and `AsyncMemoryClient` share every behaviour below.

Storage. A memory is a turn. Its conversation is the user (`run-<run_id>` or `agent-<agent_id>`
when there is none), its session the run (`default`), its agent the agent — `mem0` for a memory
added without one, as memstream needs an agent for every turn. The Mem0 identity itself
(`user_id`, `agent_id`, `run_id`, and `actor_id` for a message with a `name`) is kept in the turn's
metadata, as Mem0 keeps it in its payload, and read back from there: a result names only the
ids the memory was added with. A turn memstream's own clients wrote reads as user = conversation,
run = session (unless `default`), agent = the agent that published it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Generator, Iterable, TypeVar

from memstream_client._http import merge_positions
from memstream_client.compat.mem0.errors import NotSupported, ValidationError
from memstream_client.compat.mem0.filters import IDS, Filters, checked_id
from memstream_client.errors import MemstreamError, NotFound
from memstream_client.models import Positions, StoredTurn, Turn

T = TypeVar("T")
Plan = Generator[Any, Any, T]

IDENTITY = (*IDS, "actor_id")
NO_AGENT = "mem0"  # the memstream agent of a memory added without an agent_id
SEP = "~"  # a correction's event id is `<memory id>~<random>`: it maps back to its memory
MAX_TURNS = 500  # the API's largest max_turns
MAX_PAGE = 1000  # the API's largest page of turns
BATCH = 20  # reads made together
ROLES = {"user": "user", "assistant": "assistant", "tool": "tool", "agent": "agent"}
ABSENT = object()


@dataclass(frozen=True)
class Step:
    method: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


def step(method: str, *args: Any, **kwargs: Any) -> Step:
    return Step(method, args, {k: v for k, v in kwargs.items() if v is not None})


@dataclass(frozen=True)
class Config:
    """How a surface uses memstream. `wait_seconds`: writes return once searchable, waiting at most
    this long (0: at once). `strategy`: the search strategy (None: the server's default, zero-mem)."""

    wait_seconds: float = 30.0
    strategy: str | None = None


# -- drivers ------------------------------------------------------------------------------------
def run(plan: Plan[T], client: Any) -> T:
    """Carry `plan` out with a blocking `Client`: a failing step's MemstreamError is raised into
    the plan (which may handle it); in a list, each failure is its result instead."""
    value, error = None, None
    while True:
        try:
            request = plan.throw(error) if error is not None else plan.send(value)
        except StopIteration as done:
            return done.value
        value, error = None, None
        if isinstance(request, list):
            value = [_attempt(client, s) for s in request]
            continue
        try:
            value = getattr(client, request.method)(*request.args, **request.kwargs)
        except MemstreamError as exc:
            error = exc


async def arun(plan: Plan[T], client: Any) -> T:
    """`run` with an `AsyncClient`; a list's steps are sent concurrently."""
    value, error = None, None
    while True:
        try:
            request = plan.throw(error) if error is not None else plan.send(value)
        except StopIteration as done:
            return done.value
        value, error = None, None
        if isinstance(request, list):
            value = await asyncio.gather(*(_aattempt(client, s) for s in request))
            continue
        try:
            value = await getattr(client, request.method)(*request.args, **request.kwargs)
        except MemstreamError as exc:
            error = exc


def _attempt(client: Any, s: Step) -> Any:
    try:
        return getattr(client, s.method)(*s.args, **s.kwargs)
    except MemstreamError as exc:
        return exc


async def _aattempt(client: Any, s: Step) -> Any:
    try:
        return await getattr(client, s.method)(*s.args, **s.kwargs)
    except MemstreamError as exc:
        return exc


def _together(steps: list[Step]) -> Plan[list[Any]]:
    """The steps' results, BATCH at a time; a failure other than NotFound is raised."""
    out: list[Any] = []
    for i in range(0, len(steps), BATCH):
        got = yield steps[i:i + BATCH]
        for result in got:
            if isinstance(result, MemstreamError) and not isinstance(result, NotFound):
                raise result
        out += got
    return out


# -- mapping (pure) -----------------------------------------------------------------------------
def entity_ids(user_id: Any, agent_id: Any, run_id: Any, *, required: str | None = None) -> dict[str, str]:
    ids = {n: checked_id(n, v) for n, v in zip(IDS, (user_id, agent_id, run_id)) if v is not None}
    if required and not ids:
        raise ValidationError(required)
    return ids


def boundary(ids: dict[str, str]) -> dict[str, Any]:
    """The memstream boundary holding every memory with these ids (a superset when a memory was
    stored under another conversation: each is checked against its stored ids after)."""
    return {"conversation_id": ids.get("user_id"), "session_id": ids.get("run_id"), "agent_id": ids.get("agent_id")}


def clean_metadata(metadata: dict | None) -> dict[str, Any]:
    """Mem0's metadata as memstream stores it: the identity keys dropped (they are arguments, as
    in Mem0), values other than str/int/float/bool/None as their JSON text."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise ValidationError(f"metadata must be a dict, not {type(metadata).__name__}")
    out = {}
    for k, v in metadata.items():
        if k in IDENTITY:
            continue
        scalar = v is None or isinstance(v, (str, int, float, bool))
        out[str(k)] = v if scalar else json.dumps(v, ensure_ascii=False, sort_keys=True, default=str)
    return out


def _messages(messages: Any) -> list[Any]:
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    if isinstance(messages, dict):
        return [messages]
    if isinstance(messages, list):
        return messages
    raise ValidationError(f"messages must be str, dict, or list[dict], got {type(messages).__name__}")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # parts: [{"type": "text", "text": …}, …]
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    return str(content)


def when(timestamp: Any) -> datetime | None:
    """Mem0's `timestamp` (Unix seconds, a datetime or ISO 8601) as an aware datetime."""
    if timestamp is None:
        return None
    try:
        if isinstance(timestamp, (int, float)) and not isinstance(timestamp, bool):
            return datetime.fromtimestamp(timestamp, timezone.utc)
        if isinstance(timestamp, datetime):
            return timestamp if timestamp.tzinfo else timestamp.replace(tzinfo=timezone.utc)
        parsed = datetime.fromisoformat(str(timestamp).replace("Z", "+00:00"))
    except (ValueError, OverflowError, OSError) as exc:
        raise ValidationError(f"timestamp must be Unix seconds or an ISO 8601 date/time, not {timestamp!r}") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def turns_of(messages: Any, ids: dict[str, str], metadata: dict | None, timestamp: Any) -> list[Turn]:
    user, agent, run_ = ids.get("user_id"), ids.get("agent_id"), ids.get("run_id")
    conversation = user or (f"run-{run_}" if run_ else f"agent-{agent}")
    stored, at = {**clean_metadata(metadata), **ids}, when(timestamp)
    turns = []
    for i, m in enumerate(_messages(messages)):
        if not isinstance(m, dict) or m.get("role") is None or m.get("content") is None:
            raise ValidationError(f"message {i} needs 'role' and 'content'")
        if m["role"] == "system":
            continue  # instructions to a model, not something said
        name = m.get("name")
        turns.append(Turn(conversation_id=conversation, session_id=run_ or "default", speaker=str(name or m["role"]),
                          role=ROLES.get(m["role"], "user"), agent_id=agent or NO_AGENT, text=_text(m["content"]),
                          metadata={**stored, **({"actor_id": str(name)} if name else {})}, turn_index=i,
                          **({"occurred_at": at} if at else {})))
    return turns


def memory_id(event_id: str) -> str:
    return event_id.split(SEP, 1)[0]


def identity(turn: StoredTurn) -> tuple[dict[str, Any], dict[str, Any]]:
    """(Mem0 ids, the rest of the metadata) of a stored turn (module docstring)."""
    meta = dict(turn.metadata)
    ids = {k: meta.pop(k) for k in IDENTITY if k in meta}
    if not any(ids.get(k) is not None for k in IDS):  # written by memstream's own clients
        native = {"user_id": turn.conversation_id, "agent_id": turn.agent_id}
        if turn.session_id != "default":
            native["run_id"] = turn.session_id
        ids = {**native, **ids}
    return ids, meta


def item(root_id: str, created: datetime, latest: StoredTurn, score: Any = ABSENT) -> dict[str, Any]:
    """A memory as Mem0 returns it (`score` only where Mem0 has one: get and search)."""
    ids, meta = identity(latest)
    out: dict[str, Any] = {"id": root_id, "memory": latest.text, "hash": hashlib.md5(latest.text.encode()).hexdigest(),
                           "metadata": meta or None}
    if score is not ABSENT:
        out["score"] = score
    out.update(created_at=created.isoformat(), updated_at=latest.occurred_at.isoformat())
    out.update({k: ids[k] for k in IDENTITY if ids.get(k) is not None})
    out["role"] = latest.role
    return out


def record(memory: dict[str, Any], platform: bool) -> dict[str, Any]:
    """The fields a filter sees (filters.py): Mem0's payload of the memory."""
    out = {**(memory.get("metadata") or {}), **{k: memory[k] for k in (*IDENTITY, "role") if k in memory},
           "data": memory["memory"], "hash": memory["hash"], "created_at": memory["created_at"],
           "updated_at": memory["updated_at"]}
    if platform:
        out.update(metadata=memory.get("metadata") or {}, keywords=memory["memory"], memory_ids=memory["id"])
    return out


def history_of(versions: list[StoredTurn]) -> list[dict[str, Any]]:
    """Mem0's history rows: the original (ADD), then each correction (UPDATE)."""
    out, previous = [], None
    created = versions[0].occurred_at.isoformat() if versions else None
    for v in versions:
        ids, _ = identity(v)
        out.append({"id": v.event_id, "memory_id": versions[0].event_id, "old_memory": previous, "new_memory": v.text,
                    "event": "ADD" if previous is None else "UPDATE", "created_at": created,
                    "updated_at": None if previous is None else v.occurred_at.isoformat(), "is_deleted": False,
                    "actor_id": ids.get("actor_id"), "role": v.role})
        previous = v.text
    return out


def check_top_k(top_k: Any) -> int:
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        raise ValidationError(f"Invalid top_k: {top_k!r}. Must be a non-negative integer.")
    return top_k


def check_threshold(threshold: Any) -> None:
    if threshold is not None and (not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1):
        raise ValidationError(f"Invalid threshold: {threshold!r}. Must be between 0 and 1 (inclusive).")


def check_query(query: Any) -> str:
    if not isinstance(query, str) or not query.strip():
        raise ValidationError("Invalid query: must be a non-empty string.")
    return query.strip()


def refuse(**features: Any) -> None:
    """NotSupported for each feature given a value (None: not given)."""
    why = {"expiration_date": "memstream has no per-memory expiry: a tenant's retention forgets old turns "
                              "(`memstream tenants set TENANT --retain-days N`)",
           "memory_type": "memstream keeps every turn as it was said (no procedural or other memory types)",
           "reference_date": "relative dates resolve against the boundary's latest turn",
           "app_id": "memstream has no apps: a key's tenant is the widest scope",
           "categories": "memstream assigns no categories to memories"}
    for name, value in features.items():
        if value is not None:
            raise NotSupported(f"{name} is not supported: {why[name]}")


# -- plans ----------------------------------------------------------------------------------------
def settle(config: Config, positions: Iterable[Positions]) -> Plan[None]:
    merged = merge_positions(*positions)
    if config.wait_seconds and merged:
        yield step("wait", merged, config.wait_seconds)


def add(config: Config, messages: Any, ids: dict[str, str], metadata: dict | None, timestamp: Any) -> Plan[dict]:
    turns = turns_of(messages, ids, metadata, timestamp)
    if not turns:
        return {"results": []}
    result = yield step("add", turns)
    yield from settle(config, [result.positions])
    accepted = {i.event_id for i in result.items if i.status == "accepted"}
    refused = [i.model_dump() for i in result.items if i.status != "accepted"]
    if refused:
        raise ValidationError(f"{len(refused)} of {len(turns)} messages were refused; the others are stored "
                              f"(ids {sorted(accepted)})", details=refused)
    return {"results": [{"id": t.event_id, "memory": t.text, "event": "ADD", "actor_id": t.metadata.get("actor_id"),
                         "role": t.role} for t in turns]}


def _current(turns: list[StoredTurn]) -> Plan[list[dict[str, Any]]]:
    """Memories from their current versions (a correction's memory is created when its original was)."""
    corrected = [t for t in turns if SEP in t.event_id]
    roots = yield from _together([step("get_turn", memory_id(t.event_id), conversation_id=t.conversation_id)
                                  for t in corrected])
    created = {t.event_id: r.occurred_at for t, r in zip(corrected, roots) if not isinstance(r, NotFound)}
    out = []
    for t in turns:
        if SEP not in t.event_id:
            out.append(item(t.event_id, t.occurred_at, t))
        elif t.event_id in created:  # else its original is being forgotten
            out.append(item(memory_id(t.event_id), created[t.event_id], t))
    return out


def get(memory: Any, *, missing_ok: bool = True) -> Plan[dict | None]:
    try:
        history = yield step("turn_history", str(memory))
    except NotFound:
        if missing_ok:
            return None
        raise
    if not history.versions:
        return None
    root, latest = history.versions[0], history.versions[-1]
    return item(root.event_id, root.occurred_at, latest, score=None)


def get_all(flt: Filters, limit: int | None, platform: bool, skip: int = 0) -> Plan[tuple[list[dict], bool]]:
    """(up to `limit` memories after the first `skip`, whether more match) in time order."""
    out: list[dict[str, Any]] = []
    want = None if limit is None else skip + limit
    size = MAX_PAGE if want is None or flt.narrows else min(MAX_PAGE, want + 1)
    cursor = None
    while want is None or len(out) <= want:
        page = yield step("list_turns", **boundary(flt.ids), cursor=cursor, limit=size)
        out += [m for m in (yield from _current(page.turns)) if flt.test(record(m, platform))]
        if not page.next_cursor:
            break
        cursor = page.next_cursor
    end = None if want is None else want
    return out[skip:end], want is not None and len(out) > want


def search(config: Config, query: str, flt: Filters, top_k: int | None, platform: bool,
           explain: bool = False) -> Plan[list[dict]]:
    """Memories in evidence order, each scored with its evidence unit's `score`. `top_k` maps onto
    `max_turns` (None: the server's default); when the filter narrows beyond the boundary's ids,
    more candidates are asked for and the filter applied to them."""
    if top_k == 0:
        return []
    if flt.narrows:  # candidates enough for the filter to still fill top_k where it can
        fetch: int | None = min(MAX_TURNS, max(4 * top_k, 60) if top_k is not None else 100)
    else:
        fetch = None if top_k is None else min(MAX_TURNS, top_k)
    result = yield step("search", query, strategy=config.strategy, max_turns=fetch, **boundary(flt.ids))
    seen: set[str] = set()
    candidates = []
    for e in result.evidence:
        for t in e.turns:
            if memory_id(t.event_id) not in seen:
                seen.add(memory_id(t.event_id))
                candidates.append((t, e))
    out: list[dict[str, Any]] = []
    for i in range(0, len(candidates), BATCH):
        chunk = candidates[i:i + BATCH]
        stored = yield from _together([step("get_turn", t.event_id, conversation_id=e.conversation_id)
                                       for t, e in chunk])
        held = [(s, e) for s, (_, e) in zip(stored, chunk) if not isinstance(s, NotFound)]  # else forgotten since
        memories = yield from _current([s for s, _ in held])
        units = {memory_id(s.event_id): e for s, e in held}
        for m in memories:
            if not flt.test(record(m, platform)):
                continue
            e = units[m["id"]]
            scored = {**m, "score": e.score}
            if explain:
                scored["score_details"] = {"rank": e.rank, "role": e.role, "kind": e.kind, "signals": dict(e.scores)}
            out.append(scored)
            if top_k is not None and len(out) == top_k:
                return out
    return out


def update(config: Config, memory: Any, text: str | None, metadata: dict | None, timestamp: Any = None,
           missing: type[MemstreamError] = ValidationError) -> Plan[str]:
    """A correcting turn superseding the memory's latest version (its metadata merged into the
    latest's, as Mem0 merges), once searchable; returns the memory's id."""
    memory, positions = yield from correct(memory, text, metadata, timestamp, missing)
    yield from settle(config, [positions])
    return memory


def correct(memory: Any, text: str | None, metadata: dict | None, timestamp: Any,
            missing: type[MemstreamError]) -> Plan[tuple[str, Positions]]:
    """`update` without the wait: (the memory's id, the positions to wait on)."""
    if text is not None and not isinstance(text, str):
        raise ValidationError(f"text must be a string, not {type(text).__name__}")
    try:
        found = yield step("turn_history", str(memory))
    except NotFound:
        raise missing(f"Memory with id {memory} not found. Please provide a valid 'memory_id'") from None
    root, latest = found.versions[0], found.versions[-1]
    at = when(timestamp)
    turn = Turn(conversation_id=latest.conversation_id, session_id=latest.session_id, speaker=latest.speaker,
                role=latest.role, agent_id=latest.agent_id, text=latest.text if text is None else text,
                metadata={**latest.metadata, **clean_metadata(metadata)},
                event_id=f"{root.event_id}{SEP}{uuid.uuid4().hex[:12]}", supersedes=latest.event_id,
                **({"occurred_at": at} if at else {}))
    result = yield step("add", [turn])
    return root.event_id, result.positions


def delete(config: Config, memory: Any, missing: type[MemstreamError] = ValidationError) -> Plan[None]:
    """Every version of the memory forgotten (erased from the log and every view)."""
    positions = yield from erase(memory, missing)
    yield from settle(config, positions)


def erase(memory: Any, missing: type[MemstreamError]) -> Plan[list[Positions]]:
    """`delete` without the wait: the positions to wait on."""
    try:
        found = yield step("turn_history", str(memory))
    except NotFound:
        raise missing(f"Memory with id {memory} not found") from None
    forgot = yield from _together([step("forget", conversation_id=v.conversation_id, event_id=v.event_id)
                                   for v in found.versions])
    return [f.positions for f in forgot if not isinstance(f, NotFound)]


def delete_all(config: Config, ids: dict[str, str]) -> Plan[None]:
    """Every memory with all of `ids`: one forget of a conversation, session or agent when that
    is exactly those memories, else each matching turn's."""
    user, agent, run_ = ids.get("user_id"), ids.get("agent_id"), ids.get("run_id")
    whole_user = user and not agent and not user.startswith(("run-", "agent-")) and run_ != "default"
    if whole_user:
        forgets = [step("forget", conversation_id=user, session_id=run_)]
    elif agent and not user and not run_ and agent != NO_AGENT:
        forgets = [step("forget", agent_id=agent)]
    else:
        turns = yield from _all_turns(boundary(ids), include_superseded=True)
        forgets = [step("forget", conversation_id=t.conversation_id, event_id=t.event_id) for t in turns
                   if all(identity(t)[0].get(k) == v for k, v in ids.items())]
    forgot = yield from _together(forgets)
    yield from settle(config, [f.positions for f in forgot if not isinstance(f, NotFound)])


def _all_turns(where: dict[str, Any], include_superseded: bool) -> Plan[list[StoredTurn]]:
    out, cursor = [], None
    while True:
        page = yield step("list_turns", **where, cursor=cursor, limit=MAX_PAGE, include_superseded=include_superseded)
        out += page.turns
        if not page.next_cursor:
            return out
        cursor = page.next_cursor


def history(memory: Any) -> Plan[list[dict]]:
    try:
        found = yield step("turn_history", str(memory))
    except NotFound:
        return []
    return history_of(found.versions)


def reset(config: Config) -> Plan[None]:
    """The whole tenant forgotten: an admin key naming it (the client's `tenant_id`)."""
    forgot = yield step("forget")
    yield from settle(config, [forgot.positions])
