"""Shared plumbing of the OpenSearch view stores (lexical, hierarchy) and catalog: the client,
error translation, index naming, and the turn ledger + positions + conversation versions.

Not an adapter itself (like infra/sqlite_base.py). Index naming, shared by convention:

    <prefix>-<view>-g<N>           the view's documents (generation N)
    <prefix>-<view>-g<N>-ledger    turn ledger, per-conversation versions, positions
    <prefix>-<view>                alias on the live generation's indices (moved by the catalog)

Writes and visibility. OpenSearch has no transaction spanning documents, so a change set is
applied in the order of schemas/ports/views.py with deterministic ids (a turn's id, a unit's
id): forgets, turn deletions, turn puts, the view's deletes and upserts, an explicit refresh,
the conversation-version bumps, then the positions, then a refresh of the ledger. Every write
is acknowledged only after its translog fsync (OpenSearch's default `request` durability), so
the positions never get ahead of the view, and re-applying a change set after a crash only
rewrites the same documents. The explicit refresh (instead of refresh=wait_for, which waits up
to refresh_interval = 1 s per batch) makes a change set visible to the next search as soon as
`apply` returns; versions are bumped after it, so a query-side cache keyed on a version never
holds data older than that version.
"""

from __future__ import annotations

import json
import re
import threading
from contextlib import contextmanager
from typing import Iterable, Iterator

from opensearchpy import OpenSearch, helpers
from opensearchpy import exceptions as os_exc

from infra.turn_docs import doc_turn, ledger_dump, micros, turn_doc
from schemas.errors import MemstreamError, StoreError, TransientError
from schemas.ordering import order_turns
from schemas.ports.views import Boundary, ChangeSet, Forget, Positions, TurnRow, ViewName, once_per_request

_PAGE = 10_000  # OpenSearch's default max_result_window: one request up to here, a scroll above
_BULK_OPS = 1_000
_TRANSIENT_STATUS = {429, 502, 503, 504}
POSITIONS_ID = "_positions"


# -- naming -----------------------------------------------------------------------------------
def generation_index(prefix: str, view: str, generation: int) -> str:
    return f"{prefix}-{view}-g{generation}"


def view_alias(prefix: str, view: str) -> str:
    return f"{prefix}-{view}"


def generation_of(prefix: str, view: str, index: str) -> int | None:
    """N for `<prefix>-<view>-g<N>` or `<prefix>-<view>-g<N>-<suffix>`, else None."""
    m = re.fullmatch(re.escape(f"{prefix}-{view}-g") + r"(\d+)(?:-[a-z]+)?", index)
    return int(m.group(1)) if m else None


# -- client and errors ------------------------------------------------------------------------
def connect(url: str, **options) -> OpenSearch:
    """A client; opensearch-py connects lazily, so this does no I/O."""
    return OpenSearch(hosts=[url], timeout=options.pop("timeout", 30), **options)


@contextmanager
def translated(url: str, what: str) -> Iterator[None]:
    """Driver errors -> TransientError (retry with back-off) or StoreError (operator action)."""
    try:
        yield
    except MemstreamError:
        raise
    except os_exc.ConnectionError as exc:  # includes ConnectionTimeout
        raise TransientError(f"OpenSearch at {url} is unreachable while {what} ({type(exc).__name__}); "
                             "check that the cluster is up and reachable; the operation is retried") from exc
    except os_exc.TransportError as exc:
        status, detail = exc.status_code, _reason(exc)
        if status in (401, 403):
            raise StoreError(f"OpenSearch at {url} refused the credentials while {what} (HTTP {status}); check the user in the "
                             "URL (opensearch[s]://USER@host:port) and MEMSTREAM_VIEWS_OPENSEARCH_PASSWORD") from None
        if status in _TRANSIENT_STATUS:
            raise TransientError(f"OpenSearch at {url} is overloaded or unavailable while {what} (HTTP {status}: {detail}); "
                                 "the operation is retried, add capacity if this persists") from exc
        raise StoreError(f"OpenSearch at {url} refused {what} (HTTP {status}: {detail}); check the cluster log and the "
                         "index mappings (an index made by another memstream version needs a new generation: memstream replay)") from exc


def _reason(exc: os_exc.TransportError) -> str:
    info = exc.info if isinstance(exc.info, dict) else {}
    err = info.get("error")
    if isinstance(err, dict):
        cause = (err.get("root_cause") or [err])[0]
        return f"{cause.get('type')}: {cause.get('reason')}"
    return str(exc.error)


def bulk(client: OpenSearch, url: str, actions: list[dict], what: str) -> None:
    """Send bulk actions ({"_op_type", "_index", "_id", "_source"?}) and fail on any item error
    (the bulk API answers 200 even when items fail). Deleting a missing id is not an error."""
    for start in range(0, len(actions), _BULK_OPS):
        chunk, body = actions[start:start + _BULK_OPS], []
        for a in chunk:
            body.append({a["_op_type"]: {"_index": a["_index"], "_id": a["_id"]}})
            if a["_op_type"] == "index":
                body.append(a["_source"])
            elif a["_op_type"] == "update":
                body.append({"doc": a["_source"], "doc_as_upsert": True})
        resp = client.bulk(body=body)
        if resp.get("errors"):
            failed = [item for entry in resp["items"] for item in entry.values() if "error" in item]
            if failed:
                first = failed[0]
                err = first["error"]
                message = f"{err.get('type')}: {err.get('reason')}" if isinstance(err, dict) else str(err)
                if all(f.get("status") in _TRANSIENT_STATUS for f in failed):
                    raise TransientError(f"OpenSearch rejected {len(failed)} writes while {what} (HTTP {first.get('status')}: {message}); retried")
                raise StoreError(f"OpenSearch rejected {len(failed)} of {len(chunk)} writes while {what} "
                                 f"(index {first.get('_index')}, id {first.get('_id')}: {message}); check the index mapping")


def found_docs(client: OpenSearch, index: str, ids: list[str], source: list[str]) -> list[dict]:
    """The documents among `ids` that exist (realtime: no refresh needed), in chunks."""
    ids = list(dict.fromkeys(ids))
    out: list[dict] = []
    for start in range(0, len(ids), _BULK_OPS):
        resp = client.mget(index=index, body={"ids": ids[start:start + _BULK_OPS]}, _source=source)
        out.extend(d for d in resp["docs"] if d.get("found"))
    return out


def conversations(docs: list[dict]) -> set[tuple[str, str]]:
    return {(d["_source"]["tenant_id"], d["_source"]["conversation_id"]) for d in docs}


def all_hits(client: OpenSearch, index: str, query: dict, source: bool | list[str] = True, **extra) -> list[dict]:
    """Every hit of a query: one request when it fits in a page, a scroll otherwise."""
    body = {"query": query, "_source": source, **extra}
    resp = client.search(index=index, body={**body, "size": _PAGE, "track_total_hits": True})
    hits = resp["hits"]["hits"]
    if resp["hits"]["total"]["value"] <= len(hits):
        return hits
    return list(helpers.scan(client, index=index, query=body, size=1_000))


# -- query fragments --------------------------------------------------------------------------
def term(field: str, value) -> dict:
    return {"term": {field: value}}


def terms(field: str, values: Iterable) -> dict:
    return {"terms": {field: list(values)}}


def scope_filters(forget: Forget) -> list[dict]:
    """Tenant/conversation/session part of a forget scope (turn level: the caller adds the turn)."""
    s = forget.scope
    out = [term("tenant_id", forget.tenant_id)]
    if s.level in ("conversation", "session", "turn"):
        out.append(term("conversation_id", s.conversation_id))
    if s.level == "session":
        out.append(term("session_id", s.session_id))
    return out


def boundary_filters(b: Boundary) -> list[dict]:
    """Every part of a boundary, over documents with tenant/conversation/session/agent fields and
    occurred_from/occurred_to in microseconds. A unit is inside [since, until] if it overlaps it."""
    out = [term("tenant_id", b.tenant_id)]
    if b.conversation_ids is not None:
        out.append(terms("conversation_id", b.conversation_ids))
    if b.session_ids is not None:
        out.append(terms("session_id", b.session_ids))
    if b.agent_ids is not None:
        out.append(terms("agent_id", b.agent_ids))  # any of the unit's agents
    if b.since is not None:
        out.append({"range": {"occurred_to": {"gte": micros(b.since)}}})
    if b.until is not None:
        out.append({"range": {"occurred_from": {"lte": micros(b.until)}}})
    return out


def _conv_doc_id(tenant_id: str, conversation_id: str) -> str:
    return json.dumps(["conv", tenant_id, conversation_id])


_KEYWORD = {"type": "keyword"}
# Only the fields the ledger filters on are indexed; the rest of a turn lives in _source.
_LEDGER_MAPPINGS = {
    "dynamic": False,
    "properties": {name: _KEYWORD for name in ("type", "turn_id", "tenant_id", "conversation_id", "session_id", "event_id")},
}


class OpenSearchViewBase:
    """One generation of one view in OpenSearch: its document index and its ledger index.

    Takes the cluster URL and an index prefix; connects lazily and creates its indices on first
    use (or on `start()`). Subclasses define `view`, `_mappings()` and their document writes."""

    backend = "opensearch"
    view: ViewName

    def __init__(self, url: str, prefix: str, generation: int, *, shards: int = 1, replicas: int = 0, **client_options):
        self.url = url
        self.prefix = prefix
        self.generation = generation
        self.index = generation_index(prefix, self.view, generation)
        self.ledger_index = f"{self.index}-ledger"
        # One primary shard by default: BM25 statistics are per shard, so scores are exact
        # corpus statistics rather than per-shard estimates. Replicas are an operator's choice.
        self._settings = {"number_of_shards": shards, "number_of_replicas": replicas}
        self._client_options = client_options
        self._client: OpenSearch | None = None
        self._ready = False
        self._lock = threading.RLock()

    # -- lifecycle -----------------------------------------------------------------------
    def _mappings(self) -> dict:
        raise NotImplementedError

    def _analysis(self) -> dict:
        return {}

    def start(self) -> None:
        self._os()

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
            self._client, self._ready = None, False

    def destroy(self) -> None:
        """Delete this generation's indices (reclaiming a retired generation)."""
        with self._translate("deleting indices"):
            self._connection().indices.delete(index=f"{self.index},{self.ledger_index}", ignore_unavailable=True)
        self.close()

    def _connection(self) -> OpenSearch:
        with self._lock:
            if self._client is None:
                self._client = connect(self.url, **self._client_options)
            return self._client

    def _os(self) -> OpenSearch:
        """The client, with this generation's indices created (once per store object)."""
        client = self._connection()
        if not self._ready:
            with self._lock, self._translate("creating indices"):
                if not self._ready:
                    settings = {"index": self._settings} | ({"analysis": self._analysis()} if self._analysis() else {})
                    self._create(client, self.index, {"settings": settings, "mappings": self._mappings()})
                    self._create(client, self.ledger_index, {"settings": {"index": self._settings}, "mappings": _LEDGER_MAPPINGS})
                    self._ready = True
        return client

    def _create(self, client: OpenSearch, name: str, body: dict) -> None:
        if client.indices.exists(index=name):
            return
        try:
            client.indices.create(index=name, body=body)
        except os_exc.RequestError as exc:
            if exc.error != "resource_already_exists_exception":  # another process created it first
                raise
            return
        # A generation activated before its store created its indices (a fresh install does
        # that) already holds the view alias on the catalog's anchor: join it.
        alias = view_alias(self.prefix, self.view)
        if client.indices.exists_alias(name=alias):
            holders = client.indices.get_alias(name=alias)
            if any(generation_of(self.prefix, self.view, i) == self.generation for i in holders):
                client.indices.put_alias(index=name, name=alias)

    def _translate(self, what: str):
        return translated(self.url, what)

    def _bulk(self, actions: list[dict], what: str) -> None:
        if actions:
            bulk(self._os(), self.url, actions, what)

    # -- positions & versions ------------------------------------------------------------
    def positions(self) -> Positions:
        with self._translate("reading positions"):
            resp = self._os().get(index=self.ledger_index, id=POSITIONS_ID, ignore=404)
        if not resp.get("found"):
            return {}
        return {int(p): int(o) for p, o in resp["_source"]["positions"].items()}

    @once_per_request
    def conversation_version(self, tenant_id: str, conversation_id: str | None) -> int:
        """OpenSearch's own per-document `_version` is the counter: every write of a
        conversation's version document increments it (no scripting needed)."""
        with self._translate("reading conversation versions"):
            if conversation_id is not None:
                resp = self._os().get(index=self.ledger_index, id=_conv_doc_id(tenant_id, conversation_id), _source=False, ignore=404)
                return int(resp["_version"]) if resp.get("found") else 0
            hits = all_hits(self._os(), self.ledger_index, {"bool": {"filter": [term("type", "conv"), term("tenant_id", tenant_id)]}},
                            source=False, version=True)
            return sum(int(h["_version"]) for h in hits)

    def known_tenant(self, tenant_id: str) -> bool:
        with self._translate("looking up a tenant"):
            resp = self._os().search(index=self.ledger_index, body={
                "query": {"bool": {"filter": [term("type", "turn"), term("tenant_id", tenant_id)]}},
                "size": 0, "terminate_after": 1, "track_total_hits": True,
            })
        return resp["hits"]["total"]["value"] > 0

    # -- ledger reads ----------------------------------------------------------------------
    def _turns(self, filters: list[dict]) -> list[TurnRow]:
        with self._translate("reading the turn ledger"):
            hits = all_hits(self._os(), self.ledger_index, {"bool": {"filter": [term("type", "turn"), *filters]}})
        return [doc_turn(h["_source"]) for h in hits]

    def find_turns(self, tenant_id: str, conversation_id: str, event_ids: list[str]) -> dict[str, TurnRow]:
        if not event_ids:
            return {}
        rows = self._turns([term("tenant_id", tenant_id), term("conversation_id", conversation_id), terms("event_id", set(event_ids))])
        return {t.event_id: t for t in rows}

    def session_turns(self, tenant_id: str, conversation_id: str, session_id: str) -> list[TurnRow]:
        return order_turns(self._turns([term("tenant_id", tenant_id), term("conversation_id", conversation_id), term("session_id", session_id)]))

    def turns_in_scope(self, forget: Forget) -> list[TurnRow]:
        return self._turns(self._ledger_scope(forget))

    def ledger_dump(self) -> list[dict]:
        return ledger_dump(self._turns([]))

    @staticmethod
    def _ledger_scope(forget: Forget) -> list[dict]:
        filters = scope_filters(forget)
        if forget.scope.level == "turn":
            filters.append(term("event_id", forget.scope.event_id))
        return filters

    # -- ledger writes (call inside _translate) ------------------------------------------
    def _forget_ledger(self, forget: Forget) -> set[tuple[str, str]]:
        """Delete the scope's turns from the ledger; return the conversations touched."""
        touched = {(t.tenant_id, t.conversation_id) for t in self.turns_in_scope(forget)}
        self._os().delete_by_query(index=self.ledger_index, body={"query": {"bool": {"filter": [term("type", "turn"), *self._ledger_scope(forget)]}}},
                                   refresh=True, conflicts="proceed")
        return touched

    def _delete_turns(self, turn_ids: list[str]) -> set[tuple[str, str]]:
        if not turn_ids:
            return set()
        touched = conversations(found_docs(self._os(), self.ledger_index, turn_ids, ["tenant_id", "conversation_id"]))
        self._bulk([{"_op_type": "delete", "_index": self.ledger_index, "_id": t} for t in turn_ids], "deleting turns")
        return touched

    def _put_turns(self, turns: list[TurnRow]) -> set[tuple[str, str]]:
        self._bulk([{"_op_type": "index", "_index": self.ledger_index, "_id": t.turn_id, "_source": turn_doc(t)} for t in turns], "writing turns")
        return {(t.tenant_id, t.conversation_id) for t in turns}

    def _apply_ledger(self, change: ChangeSet, forget_view) -> set[tuple[str, str]]:
        """Forgets (view documents via `forget_view(forget)`, then the ledger), turn deletions,
        turn puts — the first half of the order in schemas/ports/views.py."""
        touched: set[tuple[str, str]] = set()
        for forget in change.forgets:
            forget_view(forget)
            touched |= self._forget_ledger(forget)
            if forget.scope.conversation_id is not None:
                touched.add((forget.tenant_id, forget.scope.conversation_id))
        touched |= self._delete_turns(change.delete_turns)
        touched |= self._put_turns(change.put_turns)
        return touched

    def _commit(self, touched: set[tuple[str, str]], positions: Positions) -> None:
        """Make the change set visible, bump versions, then record the positions (last)."""
        client = self._os()
        client.indices.refresh(index=f"{self.index},{self.ledger_index}")
        self._bulk([{"_op_type": "index", "_index": self.ledger_index, "_id": _conv_doc_id(t, c),
                     "_source": {"type": "conv", "tenant_id": t, "conversation_id": c}} for t, c in sorted(touched)], "bumping versions")
        # A partial `update` merges into the stored map: partitions not named keep their offset.
        self._bulk([{"_op_type": "update", "_index": self.ledger_index, "_id": POSITIONS_ID,
                     "_source": {"type": "positions", "positions": {str(p): o for p, o in positions.items()}}}], "writing positions")
        client.indices.refresh(index=self.ledger_index)
