"""Shared plumbing of the Qdrant adapters (dense view, catalog): the client, error translation,
collection naming, deterministic point ids, and the turn ledger + positions + versions.

Not an adapter itself (like infra/sqlite_base.py). Collection naming, shared by convention:

    <prefix>-<view>-g<N>            the generation's anchor (made by the catalog, holds no points)
    <prefix>-<view>-g<N>-<suffix>   the store's collections (dense: turn, window, episode,
                                    sentence, ledger)
    <prefix>-<view>[-<suffix>]      aliases on the live generation's collections (the catalog
                                    swaps them; a Qdrant alias names exactly one collection)

Qdrant point ids must be unsigned integers or UUIDs, so a point's id is a UUIDv5 of its
memstream id; the memstream id travels in the payload.

Writes use wait=True: Qdrant acknowledges an update once it is applied, so it is visible to
the next read (the Qdrant counterpart of an OpenSearch refresh). There is no multi-point
transaction, so a change set is applied in the order of schemas/ports/views.py with
deterministic ids — re-applying it rewrites the same points — and the positions are the
last write. Versions and positions are read-modify-write: one writer per view generation
(the pipeline's writer lock) makes that safe.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from contextlib import contextmanager
from typing import Iterable, Iterator

from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from infra.turn_docs import doc_turn, ledger_dump, micros, turn_doc
from schemas.errors import MemstreamError, StoreError, TransientError
from schemas.ordering import order_turns
from schemas.ports.views import Boundary, Forget, Positions, TurnRow, ViewName, once_per_request

_NS = uuid.uuid5(uuid.NAMESPACE_URL, "memstream")
_PAGE = 1_000


# -- naming & ids -------------------------------------------------------------------------------
def generation_name(prefix: str, view: str, generation: int) -> str:
    return f"{prefix}-{view}-g{generation}"


def generation_of(prefix: str, view: str, name: str) -> tuple[int, str] | None:
    """(N, suffix) for `<prefix>-<view>-g<N>[-<suffix>]` ('' for the anchor), else None."""
    m = re.fullmatch(re.escape(f"{prefix}-{view}-g") + r"(\d+)(?:-([a-z]+))?", name)
    return (int(m.group(1)), m.group(2) or "") if m else None


def alias_name(prefix: str, view: str, suffix: str) -> str:
    return f"{prefix}-{view}" + (f"-{suffix}" if suffix else "")


def point_uuid(*parts: str) -> str:
    return str(uuid.uuid5(_NS, "/".join(parts)))


# -- client & errors ----------------------------------------------------------------------------
def open_client(location: str | QdrantClient) -> QdrantClient:
    """`http(s)://host:port` (a server), `:memory:`, or a directory (qdrant-client's local mode:
    the same API in-process, one process per directory). Local mode opens its storage here."""
    if isinstance(location, QdrantClient):
        return location
    if location.startswith(("http://", "https://")):
        return QdrantClient(url=location)
    if location == ":memory:":
        return QdrantClient(location=":memory:")
    return QdrantClient(path=location)


def is_local(client: QdrantClient) -> bool:
    """Local mode computes exact cosine by brute force and has no payload indexes (it warns
    when given either), so those options are only sent to a server."""
    options = client.init_options
    return options.get("location") == ":memory:" or options.get("path") is not None


def describe(location: str | QdrantClient) -> str:
    return location if isinstance(location, str) else "the given QdrantClient"


@contextmanager
def translated(location: str | QdrantClient, what: str) -> Iterator[None]:
    """Client errors -> TransientError (retry with back-off) or StoreError (operator action)."""
    where = describe(location)
    try:
        yield
    except MemstreamError:
        raise
    except (ResponseHandlingException, ConnectionError, TimeoutError) as exc:
        raise TransientError(f"Qdrant at {where} is unreachable while {what} ({exc}); check that it is up; the operation is retried") from exc
    except UnexpectedResponse as exc:
        if exc.status_code in (429, 502, 503, 504):
            raise TransientError(f"Qdrant at {where} is overloaded or unavailable while {what} (HTTP {exc.status_code}); retried") from exc
        raise StoreError(f"Qdrant at {where} refused {what} (HTTP {exc.status_code}: {exc.content[:300]!r}); check the Qdrant log and "
                         "the collection's configuration (a collection made by another memstream version needs a new generation: "
                         "memstream replay)") from exc
    except RuntimeError as exc:
        if "already accessed by another instance" in str(exc):
            raise StoreError(f"the local Qdrant storage {where} is open in another process or client; local mode allows one "
                             "opener per directory: close the other one, or run a Qdrant server and point memstream at its URL") from exc
        raise StoreError(f"Qdrant ({where}) failed while {what}: {exc}") from exc
    except ValueError as exc:  # local mode reports bad requests (unknown collection, wrong dimension) this way
        raise StoreError(f"Qdrant ({where}) refused {what}: {exc}; check the collection's configuration") from exc


# -- filters ------------------------------------------------------------------------------------
def match(key: str, value) -> models.FieldCondition:
    return models.FieldCondition(key=key, match=models.MatchValue(value=value))


def match_any(key: str, values: Iterable[str]) -> models.FieldCondition:
    return models.FieldCondition(key=key, match=models.MatchAny(any=list(values)))


def scope_conditions(forget: Forget) -> list[models.FieldCondition]:
    s = forget.scope
    out = [match("tenant_id", forget.tenant_id)]
    if s.level in ("conversation", "session", "turn"):
        out.append(match("conversation_id", s.conversation_id))
    if s.level == "session":
        out.append(match("session_id", s.session_id))
    return out


def boundary_filter(b: Boundary) -> models.Filter | None:
    """Every part of a boundary (points overlap [since, until]); None when it admits nothing."""
    if any(v is not None and len(v) == 0 for v in (b.conversation_ids, b.session_ids, b.agent_ids)):
        return None
    must = [match("tenant_id", b.tenant_id)]
    if b.conversation_ids is not None:
        must.append(match_any("conversation_id", b.conversation_ids))
    if b.session_ids is not None:
        must.append(match_any("session_id", b.session_ids))
    if b.agent_ids is not None:
        must.append(match_any("agent_id", b.agent_ids))  # any of the point's agents
    if b.since is not None:
        must.append(models.FieldCondition(key="occurred_to", range=models.Range(gte=micros(b.since))))
    if b.until is not None:
        must.append(models.FieldCondition(key="occurred_from", range=models.Range(lte=micros(b.until))))
    return models.Filter(must=must)


def _conv_point(tenant_id: str, conversation_id: str) -> str:
    return point_uuid("conv", json.dumps([tenant_id, conversation_id]))


_POSITIONS = point_uuid("positions")
_LEDGER_INDEXES = {name: models.PayloadSchemaType.KEYWORD for name in ("type", "tenant_id", "conversation_id", "session_id", "event_id", "turn_id")}


class QdrantViewBase:
    """One generation of one view in Qdrant, with its ledger collection `<base>-ledger`
    (points without vectors: turns, per-conversation versions, positions, and whatever the
    subclass keeps there). Connects lazily; creates the ledger on first use."""

    backend = "qdrant"
    view: ViewName

    def __init__(self, location: str | QdrantClient, prefix: str, generation: int):
        self.location = location
        self.prefix = prefix
        self.generation = generation
        self.base = generation_name(prefix, self.view, generation)
        self.ledger = f"{self.base}-ledger"
        self._client: QdrantClient | None = None
        self._known: set[str] = set()  # collections seen to exist (they are never dropped under a live store)
        self._lock = threading.RLock()

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        self._qd()

    def close(self) -> None:
        with self._lock:
            if self._client is not None and isinstance(self.location, str):
                self._client.close()  # a client handed in belongs to the caller
            self._client = None
            self._known.clear()

    def _translate(self, what: str):
        return translated(self.location, what)

    def _connection(self) -> QdrantClient:
        with self._lock:
            if self._client is None:
                with self._translate("connecting"):
                    self._client = open_client(self.location)
            return self._client

    def _qd(self) -> QdrantClient:
        client = self._connection()
        if self.ledger not in self._known:
            self._create(self.ledger, {}, _LEDGER_INDEXES)
        return client

    def _exists(self, name: str) -> bool:
        if name not in self._known and self._connection().collection_exists(name):
            self._known.add(name)
        return name in self._known

    def _create(self, name: str, vectors: models.VectorParams | dict, indexes: dict) -> None:
        client = self._connection()
        with self._lock, self._translate(f"creating collection {name}"):
            if self._exists(name):
                return
            client.create_collection(name, vectors_config=vectors)
            if not is_local(client):
                for field, schema in indexes.items():
                    client.create_payload_index(name, field, schema, wait=True)
            self._known.add(name)
            self._join_live_aliases(client, name)

    def _join_live_aliases(self, client: QdrantClient, name: str) -> None:
        """A generation activated before this collection existed (a fresh install activates
        first, then writes) gets the collection's alias now, as activation would have."""
        parsed = generation_of(self.prefix, self.view, name)
        aliases = {a.alias_name: a.collection_name for a in client.get_aliases().aliases}
        if parsed and aliases.get(alias_name(self.prefix, self.view, "")) == self.base:
            client.update_collection_aliases(change_aliases_operations=[models.CreateAliasOperation(
                create_alias=models.CreateAlias(collection_name=name, alias_name=alias_name(self.prefix, self.view, parsed[1])))])

    def _scroll(self, name: str, flt: models.Filter | None, payload=True, vectors: bool = False) -> list[models.Record]:
        client, out, offset = self._connection(), [], None
        while True:
            page, offset = client.scroll(name, scroll_filter=flt, limit=_PAGE, offset=offset, with_payload=payload, with_vectors=vectors)
            out.extend(page)
            if offset is None:
                return out

    # -- positions & versions ------------------------------------------------------------
    def positions(self) -> Positions:
        with self._translate("reading positions"):
            got = self._qd().retrieve(self.ledger, [_POSITIONS])
        return {int(p): int(o) for p, o in got[0].payload["positions"].items()} if got else {}

    @once_per_request
    def conversation_version(self, tenant_id: str, conversation_id: str | None) -> int:
        with self._translate("reading conversation versions"):
            if conversation_id is not None:
                got = self._qd().retrieve(self.ledger, [_conv_point(tenant_id, conversation_id)])
                return int(got[0].payload["version"]) if got else 0
            self._qd()
            points = self._scroll(self.ledger, models.Filter(must=[match("type", "conv"), match("tenant_id", tenant_id)]))
        return sum(int(p.payload["version"]) for p in points)

    def known_tenant(self, tenant_id: str) -> bool:
        with self._translate("looking up a tenant"):
            page, _ = self._qd().scroll(self.ledger, scroll_filter=models.Filter(must=[match("type", "turn"), match("tenant_id", tenant_id)]),
                                        limit=1, with_payload=False)
        return bool(page)

    # -- ledger ----------------------------------------------------------------------------
    def _turns(self, conditions: list) -> list[TurnRow]:
        with self._translate("reading the turn ledger"):
            self._qd()
            points = self._scroll(self.ledger, models.Filter(must=[match("type", "turn"), *conditions]))
        return [doc_turn(p.payload) for p in points]

    def find_turns(self, tenant_id: str, conversation_id: str, event_ids: list[str]) -> dict[str, TurnRow]:
        if not event_ids:
            return {}
        rows = self._turns([match("tenant_id", tenant_id), match("conversation_id", conversation_id), match_any("event_id", set(event_ids))])
        return {t.event_id: t for t in rows}

    def session_turns(self, tenant_id: str, conversation_id: str, session_id: str) -> list[TurnRow]:
        return order_turns(self._turns([match("tenant_id", tenant_id), match("conversation_id", conversation_id), match("session_id", session_id)]))

    def turns_in_scope(self, forget: Forget) -> list[TurnRow]:
        return self._turns(self._ledger_scope(forget))

    def ledger_dump(self) -> list[dict]:
        return ledger_dump(self._turns([]))

    @staticmethod
    def _ledger_scope(forget: Forget) -> list:
        conditions = scope_conditions(forget)
        if forget.scope.level == "turn":
            conditions.append(match("event_id", forget.scope.event_id))
        return conditions

    # -- ledger writes (call inside _translate) ------------------------------------------
    def _forget_ledger(self, forget: Forget) -> None:
        """Delete the scope's turns from the ledger. Callers delete the view's points first
        (found through these turns), so a forget interrupted half-way can be re-applied."""
        self._qd().delete(self.ledger, models.FilterSelector(filter=models.Filter(must=[match("type", "turn"), *self._ledger_scope(forget)])), wait=True)

    def _delete_turns(self, turn_ids: list[str]) -> set[tuple[str, str]]:
        if not turn_ids:
            return set()
        ids = [point_uuid("turn", t) for t in turn_ids]
        found = self._qd().retrieve(self.ledger, ids, with_payload=["tenant_id", "conversation_id"])
        self._qd().delete(self.ledger, models.PointIdsList(points=ids), wait=True)
        return {(p.payload["tenant_id"], p.payload["conversation_id"]) for p in found}

    def _put_turns(self, turns: list[TurnRow]) -> set[tuple[str, str]]:
        if turns:
            self._qd().upsert(self.ledger, [models.PointStruct(id=point_uuid("turn", t.turn_id), vector={}, payload=turn_doc(t)) for t in turns], wait=True)
        return {(t.tenant_id, t.conversation_id) for t in turns}

    def _commit(self, touched: set[tuple[str, str]], positions: Positions) -> None:
        """Bump the touched conversations' versions, then record the positions (last)."""
        client = self._qd()
        if touched:
            ids = [_conv_point(t, c) for t, c in sorted(touched)]
            current = {p.id: int(p.payload["version"]) for p in client.retrieve(self.ledger, ids)}
            client.upsert(self.ledger, [
                models.PointStruct(id=pid, vector={}, payload={"type": "conv", "tenant_id": t, "conversation_id": c, "version": current.get(pid, 0) + 1})
                for pid, (t, c) in zip(ids, sorted(touched))
            ], wait=True)
        merged = {**self.positions(), **positions}  # partitions not named keep their offset
        client.upsert(self.ledger, [models.PointStruct(id=_POSITIONS, vector={}, payload={
            "type": "positions", "positions": {str(p): o for p, o in merged.items()}})], wait=True)
