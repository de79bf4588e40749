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

No plaintext. Qdrant keeps every update in its write-ahead log (and a deleted point's payload
in segment files until they are optimised), so what a forget must erase is never written in
the clear: a ledger turn's text, speaker and source_ref travel as one field, `sealed`, sealed
with the turn's own data key (schemas/sealing.py's TextSealer, given to the constructor), and
destroying that key on forget shreds every copy Qdrant keeps. Reads open them in one batch per
call; a turn whose key is destroyed (it is being forgotten) comes back with text '' and speaker
''. Points carry ids, times and vectors only.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from contextlib import contextmanager
from typing import Iterable, Iterator

import grpc
from qdrant_client import QdrantClient, models
from qdrant_client import grpc as qgrpc
from qdrant_client.conversions.conversion import RestToGrpc
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from infra.turn_docs import doc_turn, ledger_dump, micros, turn_doc
from schemas import faults
from schemas.errors import CredentialsRefused, MemstreamError, StoreError, TransientError
from schemas.ordering import order_turns
from schemas.ports.views import Boundary, Forget, Positions, TurnRow, ViewName, once_per_request
from schemas.sealing import TextSealer

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
def connect(host_port: str, *, https: bool = False, grpc_port: int | None = None, api_key: str | None = None,
            timeout: float = 30.0) -> QdrantClient:
    """A client of a Qdrant server. With `grpc_port` every call goes over gRPC (protobuf, one
    HTTP/2 connection), which is what the query path wants: a boundary's score_units returns
    every admissible point, and JSON decoding of that was most of a REST call's time. No I/O
    happens here; the first call connects. `check_compatibility=False`: the client is pinned
    to the server's minor version in requirements.lock, so the start-up version probe (one
    more round trip, and a warning in every process) adds nothing."""
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected host:port, got {host_port!r}")
    return QdrantClient(host=host, port=int(port), https=https, grpc_port=grpc_port or 6334, prefer_grpc=grpc_port is not None,
                        api_key=api_key, timeout=int(timeout), check_compatibility=False,
                        grpc_options=dict(GRPC_OPTIONS))  # a copy: the client adds its user agent to the dict it is given


# gRPC backs off between reconnection attempts up to 120 s by default, and channels to one address
# share that state: after a Qdrant restart every call failed at once for minutes although the
# server was up (seen in tests/integration/test_qdrant_server.py). Retry the connection at most
# every second instead; callers back off themselves (TransientError).
GRPC_OPTIONS = {"grpc.initial_reconnect_backoff_ms": 100, "grpc.min_reconnect_backoff_ms": 100, "grpc.max_reconnect_backoff_ms": 1000}


def open_client(location: str | QdrantClient) -> QdrantClient:
    """`http(s)://host:port` (a server), `:memory:`, or a directory (qdrant-client's local mode:
    the same API in-process, one process per directory). Local mode opens its storage here."""
    if isinstance(location, QdrantClient):
        return location
    if is_server(location):
        return QdrantClient(url=location, check_compatibility=False)
    if location == ":memory:":
        return QdrantClient(location=":memory:")
    return QdrantClient(path=location)


def grpc_points(client: QdrantClient):
    """The client's raw gRPC points stub (authenticated channel, warm) when it talks gRPC to a
    server, else None. A read that returns every point of a boundary calls the stub directly:
    qdrant-client turns each protobuf hit into a pydantic model, which was ~60% of such a call
    (2,000 hits with one payload field: 75 ms through `query_points`, 29 ms through the stub,
    of which 13 ms is the server's). `_client` is the client's own remote; the version is pinned
    in requirements.lock and both paths run in the contract suite (qdrant-server-grpc/-rest)."""
    remote = getattr(client, "_client", None)
    return remote.grpc_points if getattr(remote, "_prefer_grpc", False) else None


def upsert(client: QdrantClient, collection: str, points: list[models.PointStruct]) -> None:
    """Upsert and wait for it. Over gRPC the points go straight to the stub (grpc_points), turned
    into protobuf by the client's own RestToGrpc: qdrant-client's `upsert` first walks every
    point's pydantic model looking for inference objects (documents, images) to embed, which was
    the largest single cost of the dense projection in a bulk load (py-spy on
    benchmarks/distributed_scale.py: ~16 % of the projecting process's busy samples)."""
    stub = grpc_points(client)
    if stub is None:
        client.upsert(collection, points, wait=True)
        return
    stub.Upsert(qgrpc.UpsertPoints(collection_name=collection, wait=True, points=[RestToGrpc.convert_point_struct(p) for p in points]),
                timeout=client._client._timeout)


def is_server(location: str | QdrantClient) -> bool:
    """A Qdrant server (reads are round trips), not qdrant-client's in-process local mode."""
    if isinstance(location, QdrantClient):
        return not is_local(location)
    return location.startswith(("http://", "https://"))


def is_local(client: QdrantClient) -> bool:
    """Local mode computes exact cosine by brute force and has no payload indexes (it warns
    when given either), so those options are only sent to a server."""
    options = client.init_options
    return options.get("location") == ":memory:" or options.get("path") is not None


def describe(location: str | QdrantClient) -> str:
    """Where the store is, for error messages: a URL or path (never the API key)."""
    if isinstance(location, str):
        return location
    o = location.init_options
    if o.get("path") or o.get("location") == ":memory:":
        return f"local storage {o.get('path') or ':memory:'}"
    scheme = "https" if o.get("https") else "http"
    where = o.get("url") or f"{scheme}://{o.get('host') or 'localhost'}:{o.get('port') or 6333}"
    return where + (f" (gRPC port {o.get('grpc_port')})" if o.get("prefer_grpc") else "")


# gRPC status codes that mean "try again": the server is down, restarting, overloaded or slow.
_GRPC_TRANSIENT = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED,
                   grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED}
_GRPC_AUTH = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
_AUTH_HINT = "check MEMSTREAM_VIEWS_QDRANT_API_KEY against the server's api_key (QDRANT__SERVICE__API_KEY)"


@contextmanager
def translated(location: str | QdrantClient, what: str) -> Iterator[None]:
    """Client errors -> TransientError (retry with back-off) or StoreError (operator action).
    The client raises three families: REST (UnexpectedResponse / ResponseHandlingException),
    gRPC (grpc.RpcError, when the URL names a grpc_port) and local mode's Python exceptions."""
    where = describe(location)
    try:
        yield
    except MemstreamError:
        raise
    except grpc.RpcError as exc:
        code, details = exc.code(), (exc.details() or "")[:300]
        if code in _GRPC_TRANSIENT:
            raise TransientError(f"Qdrant at {where} is unreachable or overloaded while {what} (gRPC {code.name}: {details}); "
                                 "check that it is up; the operation is retried") from None
        if code in _GRPC_AUTH:
            raise CredentialsRefused(f"Qdrant at {where} refused the credentials while {what} (gRPC {code.name}); {_AUTH_HINT}") from None
        raise StoreError(f"Qdrant at {where} refused {what} (gRPC {code.name}: {details}); check the Qdrant log and the collection's "
                         "configuration (a collection made by another memstream version needs a new generation: memstream replay)") from None
    except (ResponseHandlingException, ConnectionError, TimeoutError) as exc:
        raise TransientError(f"Qdrant at {where} is unreachable while {what} ({exc}); check that it is up; the operation is retried") from exc
    except UnexpectedResponse as exc:
        if exc.status_code in (429, 502, 503, 504):
            raise TransientError(f"Qdrant at {where} is overloaded or unavailable while {what} (HTTP {exc.status_code}); retried") from exc
        if exc.status_code in (401, 403):
            raise CredentialsRefused(f"Qdrant at {where} refused the credentials while {what} (HTTP {exc.status_code}); {_AUTH_HINT}") from None
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
    """Tenant/conversation/session part of a forget scope: for view points, which a scope that
    is not partial removes by these fields (a partial one reaches them through the ledger's
    turns). The ledger's own rule is `ledger_conditions`."""
    s = forget.scope
    out = [match("tenant_id", forget.tenant_id)]
    if s.level in ("conversation", "session", "turn"):
        out.append(match("conversation_id", s.conversation_id))
    if s.level == "session":
        out.append(match("session_id", s.session_id))
    return out


def ledger_conditions(forget: Forget) -> list[models.FieldCondition]:
    """Conditions over ledger turn points for the turns a forget covers (ForgetScope.covers)."""
    s, out = forget.scope, scope_conditions(forget)
    if s.level == "turn":
        out.append(match("event_id", s.event_id))
    if s.level == "agent":
        out.append(match("agent_id", s.agent_id))
    if s.occurred_before is not None:
        out.append(models.FieldCondition(key="occurred_us", range=models.Range(lt=micros(s.occurred_before))))
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


def _position_point(partition: int) -> str:
    return point_uuid("position", str(partition))
_LEDGER_INDEXES = {**{name: models.PayloadSchemaType.KEYWORD for name in ("type", "tenant_id", "conversation_id", "session_id", "event_id", "turn_id",
                                                                         "agent_id")},
                   "occurred_us": models.PayloadSchemaType.INTEGER}
_SEALED_FIELDS = ("text", "speaker", "source_ref")


def seal_turns(turns: list[TurnRow], sealer: TextSealer) -> list[dict]:
    """Ledger turns' payloads: turn_doc without text, speaker and source_ref, which travel
    sealed with each turn's data key (module docstring); one key store round trip."""
    tokens = sealer.seal_many([(t.tenant_id, t.conversation_id, t.event_id, json.dumps([t.text, t.speaker, t.source_ref])) for t in turns])
    return [{**{k: v for k, v in turn_doc(t).items() if k not in _SEALED_FIELDS}, "sealed": token} for t, token in zip(turns, tokens)]


def open_turns(payloads: list[dict], sealer: TextSealer | None) -> list[TurnRow]:
    """Ledger payloads back to turns, opening the sealed fields in one batch (sealer None: not
    opened, text '' and speaker '', for reads that need ids only). A destroyed key opens to
    nothing: the turn is being forgotten."""
    sealed = [d for d in payloads if "sealed" in d]
    opened = sealer.open_many([(d["tenant_id"], d["conversation_id"], d["event_id"], d["sealed"]) for d in sealed]) if sealer and sealed else []
    plain = {id(d): p for d, p in zip(sealed, opened)}
    out = []
    for d in payloads:
        if "sealed" in d:  # (a payload written before sealing keeps its fields as they were)
            got = plain.get(id(d))
            text, speaker, source_ref = json.loads(got) if got is not None else ("", "", None)
            d = {**d, "text": text, "speaker": speaker, "source_ref": source_ref}
        out.append(doc_turn(d))
    return out


class QdrantViewBase:
    """One generation of one view in Qdrant, with its ledger collection `<base>-ledger`
    (points without vectors: turns, per-conversation versions, positions, and whatever the
    subclass keeps there). Connects lazily; creates the ledger on first use."""

    backend = "qdrant"
    view: ViewName

    def __init__(self, location: str | QdrantClient, prefix: str, generation: int, *, sealer: TextSealer):
        self.location = location
        self.prefix = prefix
        self.generation = generation
        self.sealer = sealer  # seals the ledger's text (module docstring)
        self.base = generation_name(prefix, self.view, generation)
        self.ledger = f"{self.base}-ledger"
        self._client: QdrantClient | None = None
        self._known: set[str] = set()  # collections seen to exist (they are never dropped under a live store)
        self._lock = threading.RLock()

    @property
    def remote(self) -> bool:
        return is_server(self.location)

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

    def _create(self, name: str, vectors: models.VectorParams | dict, indexes: dict, **options) -> None:
        """Create a collection and its payload indexes unless they exist. Workers sharing a
        consumer group may race to create the same collection: the loser finds it made. Index
        creation is idempotent on the server and always sent once per process, so a writer that
        died between the two calls leaves no collection without its indexes."""
        client = self._connection()
        with self._lock, self._translate(f"creating collection {name}"):
            if name in self._known:
                return
            if not client.collection_exists(name):
                try:
                    client.create_collection(name, vectors_config=vectors, **({} if is_local(client) else options))
                except Exception:
                    if not client.collection_exists(name):  # a real failure, not a lost race
                        raise
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

    # -- erasure (schemas/ports/views.py) ------------------------------------------------
    erasure_deferred_seconds = 0.0  # nothing to erase: what a forget removes was never written in the clear

    def erase_pending(self) -> float | None:
        return None

    def erase_due(self) -> float | None:
        return None

    # -- positions & versions ------------------------------------------------------------
    def positions(self) -> Positions:
        with self._translate("reading positions"):
            self._qd()
            points = self._scroll(self.ledger, models.Filter(must=[match("type", "position")]))
        return {int(p.payload["partition"]): int(p.payload["offset"]) for p in points}

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
    def _turns(self, conditions: list, *, opened: bool = True) -> list[TurnRow]:
        """Ledger turns matching `conditions`; `opened=False` leaves the sealed fields shut
        (text '' and speaker ''), for reads that need only ids, order and hashes."""
        with self._translate("reading the turn ledger"):
            self._qd()
            points = self._scroll(self.ledger, models.Filter(must=[match("type", "turn"), *conditions]))
        return open_turns([p.payload for p in points], self.sealer if opened else None)

    def find_turns(self, tenant_id: str, conversation_id: str, event_ids: list[str]) -> dict[str, TurnRow]:
        if not event_ids:
            return {}
        rows = self._turns([match("tenant_id", tenant_id), match("conversation_id", conversation_id), match_any("event_id", set(event_ids))])
        return {t.event_id: t for t in rows}

    def session_turns(self, tenant_id: str, conversation_id: str, session_id: str) -> list[TurnRow]:
        return order_turns(self._turns([match("tenant_id", tenant_id), match("conversation_id", conversation_id), match("session_id", session_id)]))

    def turns_in_scope(self, forget: Forget) -> list[TurnRow]:
        return self._turns(ledger_conditions(forget))

    def ledger_dump(self) -> list[dict]:
        return ledger_dump(self._turns([], opened=False))

    # -- ledger writes (call inside _translate) ------------------------------------------
    def _forget_ledger(self, forget: Forget) -> None:
        """Delete the scope's turns from the ledger. Callers delete the view's points first
        (found through these turns), so a forget interrupted half-way can be re-applied."""
        self._qd().delete(self.ledger, models.FilterSelector(filter=models.Filter(must=[match("type", "turn"), *ledger_conditions(forget)])), wait=True)

    def _delete_turns(self, turn_ids: list[str]) -> set[tuple[str, str]]:
        if not turn_ids:
            return set()
        ids = [point_uuid("turn", t) for t in turn_ids]
        found = self._qd().retrieve(self.ledger, ids, with_payload=["tenant_id", "conversation_id"])
        self._qd().delete(self.ledger, models.PointIdsList(points=ids), wait=True)
        return {(p.payload["tenant_id"], p.payload["conversation_id"]) for p in found}

    def _put_turns(self, turns: list[TurnRow]) -> set[tuple[str, str]]:
        if turns:
            upsert(self._qd(), self.ledger, [models.PointStruct(id=point_uuid("turn", t.turn_id), vector={}, payload=payload)
                                             for t, payload in zip(turns, seal_turns(turns, self.sealer))])
        return {(t.tenant_id, t.conversation_id) for t in turns}

    def _commit(self, touched: set[tuple[str, str]], positions: Positions) -> None:
        """Bump the touched conversations' versions, then record the positions (last)."""
        faults.hit("view-written")  # crash tests (schemas/faults.py): points written, positions not
        client = self._qd()
        if touched:
            ids = [_conv_point(t, c) for t, c in sorted(touched)]
            current = {p.id: int(p.payload["version"]) for p in client.retrieve(self.ledger, ids)}
            upsert(client, self.ledger, [
                models.PointStruct(id=pid, vector={}, payload={"type": "conv", "tenant_id": t, "conversation_id": c, "version": current.get(pid, 0) + 1})
                for pid, (t, c) in zip(ids, sorted(touched))
            ])
        # One point per partition, written blind: workers that share a consumer group write
        # their own partitions' points, so no read-modify-write can lose another's progress.
        if positions:
            upsert(client, self.ledger, [models.PointStruct(id=_position_point(p), vector={}, payload={
                "type": "position", "partition": int(p), "offset": int(o)}) for p, o in sorted(positions.items())])
