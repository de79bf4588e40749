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

Erasure is deferred, with a bound. A delete in Lucene only marks the document (a soft delete);
its bytes stay in the segment — stored `_source` in LZ4 blocks, in which a word is readable —
until a merge rewrites the segment, and the translog keeps the original write until a flush.
OpenSearch also keeps soft-deleted documents for peer recovery as long as a shard's retention
lease is below their sequence number, and it moves the leases forward only on its periodic
retention-lease sync (every 30 s, a setting users may not change). So, measured on OpenSearch
2.19: a forced merge right after the delete keeps the document; one after the lease has passed
the delete drops it, provided the merge policy lets every segment with a delete be merged
(`index.merge.policy.expunge_deletes_allowed: 0`; the default, 10 %, skips segments with fewer
deletes). Every index is created with that, and with a short lease period for copies that went
away (`index.soft_deletes.retention_lease.period: 30s`, default 12 h), which would otherwise hold
deleted documents for half a day. After a change set that forgets or deletes turns, the store
records a pending erasure — for each index and shard, its highest sequence number — in the ledger
(`_erasure`, written before the positions, so a crash cannot lose it); `erase_pending()` says how
long until it is due and `erase_due()` runs it: for each index whose leases have all passed the
recorded numbers, `_forcemerge?only_expunge_deletes=true`, a refresh (the searcher otherwise
keeps the old segment files open, and Lucene keeps files a reader uses) and a flush (which drops
the translog generations holding the original writes). Measured bound: 30 s after the forget
(the lease sync) plus the merge, when the runner calls `erase_due()` on time.
"""

from __future__ import annotations

import json
import re
import threading
import time
from contextlib import contextmanager
from typing import Iterable, Iterator

from opensearchpy import OpenSearch, helpers
from opensearchpy import exceptions as os_exc

from infra.turn_docs import doc_turn, ledger_dump, micros, turn_doc
from schemas import faults
from schemas.errors import CredentialsRefused, FormatTooNew, MemstreamError, StoreError, TransientError
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
            raise CredentialsRefused(f"OpenSearch at {url} refused the credentials while {what} (HTTP {status}); check the user in the "
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
    """Tenant/conversation/session part of a forget scope: for view documents, which a scope
    that is not partial removes by these fields (a partial one reaches them through the
    ledger's turns). The ledger's own rule is `ledger_scope`."""
    s = forget.scope
    out = [term("tenant_id", forget.tenant_id)]
    if s.level in ("conversation", "session", "turn"):
        out.append(term("conversation_id", s.conversation_id))
    if s.level == "session":
        out.append(term("session_id", s.session_id))
    return out


def ledger_scope(forget: Forget) -> list[dict]:
    """Filters over ledger turn documents for the turns a forget covers (ForgetScope.covers)."""
    s, out = forget.scope, scope_filters(forget)
    if s.level == "turn":
        out.append(term("event_id", s.event_id))
    if s.level == "agent":
        out.append(term("agent_id", s.agent_id))
    if s.occurred_before is not None:
        out.append({"range": {"occurred_us": {"lt": micros(s.occurred_before)}}})
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
    "properties": {**{name: _KEYWORD for name in ("type", "turn_id", "tenant_id", "conversation_id", "session_id", "event_id", "agent_id",
                                                  "supersedes", "speaker")},
                   "occurred_us": {"type": "long"}},
}
ERASURE_ID = "_erasure"
# What lets a forced merge drop deleted documents (module docstring). Dynamic settings: indices
# made before them get them when a store opens them.
ERASURE_SETTINGS = {"merge.policy.expunge_deletes_allowed": 0, "soft_deletes.retention_lease.period": "30s"}
LEASE_SYNC_SECONDS = 30.0  # OpenSearch's retention-lease sync interval (not user-settable)


class OpenSearchViewBase:
    """One generation of one view in OpenSearch: its document index and its ledger index.

    Takes the cluster URL and an index prefix; connects lazily and creates its indices on first
    use (or on `start()`). Subclasses define `view`, `_mappings()` and their document writes.

    Formats (infra/formats.py). The format of a generation's documents is recorded in its
    document index's mapping (`_meta.format`; none recorded: format 1). On first use an index
    in an older format is migrated in place (`_migrate_documents`: views are derived data, and
    every field a new format adds is computed from what the documents already hold), then
    stamped; one in a newer format is refused (a newer release wrote it). A migration is
    idempotent and safe beside a writer, so a reader that meets the old format first runs it too."""

    # 1: before formats were recorded. Raise it (and implement `_migrate_documents`) whenever
    # the documents' fields change.
    format_version = 1

    backend = "opensearch"
    remote = True
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
        self._erasure: dict | None = None  # the pending erasure ({"targets": {index: {shard: seq_no}}, "since": t}), read lazily

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
                    index_settings = self._settings | ERASURE_SETTINGS
                    ledger = {"settings": {"index": index_settings}, "mappings": _LEDGER_MAPPINGS}
                    self._create(client, self.ledger_index, ledger)
                    if self._shared_document_index(client):
                        self._create(client, self.index, self._index_body())
                        self._check_format(client)
                    self._ready = True
        return client

    def _shared_document_index(self, client: OpenSearch) -> bool:
        """Whether this generation keeps its documents in the one index `self.index` (made at
        start). The lexical view keeps one index per tenant instead (infra/lexical/opensearch.py)."""
        return True

    def _document_indices(self) -> list[str]:
        """The document indices the current change set wrote: refreshed at its commit, and
        recorded for erasure when it forgets."""
        return [self.index]

    def _index_body(self) -> dict:
        """Settings and mappings of a document index of this view."""
        settings = {"index": self._settings | ERASURE_SETTINGS} | ({"analysis": self._analysis()} if self._analysis() else {})
        return {"settings": settings, "mappings": {**self._mappings(), "_meta": {"format": self.format_version}}}

    def _check_format(self, client: OpenSearch) -> None:
        """Migrate the document index from an older format, or refuse a newer one (class docstring)."""
        mapping = client.indices.get_mapping(index=self.index)[self.index]["mappings"]
        found = int(mapping.get("_meta", {}).get("format", 1))
        if found > self.format_version:
            raise FormatTooNew(f"OpenSearch index {self.index} at {self.url} holds the {self.view} view in format "
                               f"{found}, written by a newer memstream (this release reads formats up to "
                               f"{self.format_version}): run that release, or build a new generation with this one "
                               f"(memstream replay {self.view})")
        if found < self.format_version:
            self._migrate_documents(client, found)
            meta = {**mapping.get("_meta", {}), "format": self.format_version}
            client.indices.put_mapping(index=self.index, body={"_meta": meta})

    def _migrate_documents(self, client: OpenSearch, found: int) -> None:
        """Bring the documents of format `found` to `format_version` (see the class docstring)."""
        raise NotImplementedError(f"{type(self).__name__} has no migration from format {found}")

    def _create(self, client: OpenSearch, name: str, body: dict) -> None:
        if client.indices.exists(index=name):
            if name == self.ledger_index:  # ledger fields added since the index was made (adding a field is allowed)
                client.indices.put_mapping(index=name, body={"properties": _LEDGER_MAPPINGS["properties"]})
            current = client.indices.get_settings(index=name, name="index.merge.policy.expunge_deletes_allowed,"
                                                  "index.soft_deletes.retention_lease.period", flat_settings=True)
            want = {f"index.{k}": str(v) for k, v in ERASURE_SETTINGS.items()}
            if current.get(name, {}).get("settings", {}) != want:  # an index made before erasure settings existed
                client.indices.put_settings(index=name, body={"index": ERASURE_SETTINGS})
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
        return self._turns(ledger_scope(forget))

    def ledger_dump(self) -> list[dict]:
        return ledger_dump(self._turns([]))

    # -- turns as the API lists them (schemas/ports/unit_store.py) ------------------------------
    def _ledger_boundary(self, b: Boundary) -> list[dict]:
        out = [term("type", "turn"), term("tenant_id", b.tenant_id)]
        if b.conversation_ids is not None:
            out.append(terms("conversation_id", b.conversation_ids))
        if b.session_ids is not None:
            out.append(terms("session_id", b.session_ids))
        return out

    def superseded(self, boundary: Boundary) -> set[str]:
        """Two reads: the corrections among the boundary's conversations, then the turns they name."""
        conv = [term("type", "turn"), term("tenant_id", boundary.tenant_id), {"exists": {"field": "supersedes"}}]
        if boundary.conversation_ids is not None:
            conv.append(terms("conversation_id", boundary.conversation_ids))
        with self._translate("reading corrections"):
            hits = all_hits(self._os(), self.ledger_index, {"bool": {"filter": conv}}, source=["conversation_id", "event_id", "supersedes"])
            named: dict[str, set[str]] = {}
            for h in hits:
                src = h["_source"]
                if src.get("supersedes") and src["supersedes"] != src["event_id"]:
                    named.setdefault(src["conversation_id"], set()).add(src["supersedes"])
            out: set[str] = set()
            for conversation_id, events in named.items():
                flt = [*self._ledger_boundary(boundary), term("conversation_id", conversation_id), terms("event_id", events)]
                out |= {h["_source"]["turn_id"] for h in all_hits(self._os(), self.ledger_index, {"bool": {"filter": flt}}, source=["turn_id"])}
        return out

    def page_turns(self, boundary: Boundary, after: tuple[int, str] | None, limit: int, *,
                   include_superseded: bool = False) -> list[TurnRow]:
        flt = self._ledger_boundary(boundary)
        if boundary.agent_ids is not None:
            flt.append(terms("agent_id", boundary.agent_ids))
        query: dict = {"bool": {"filter": flt}}
        if not include_superseded:
            hidden = self.superseded(boundary)
            if hidden:
                query["bool"]["must_not"] = [terms("turn_id", hidden)]
        body = {"query": query, "size": limit, "sort": [{"occurred_us": "asc"}, {"turn_id": "asc"}]}
        if after is not None:
            body["search_after"] = [after[0], after[1]]
        with self._translate("listing turns"):
            hits = self._os().search(index=self.ledger_index, body=body)["hits"]["hits"]
        return [doc_turn(h["_source"]) for h in hits]

    def turns_by_event(self, tenant_id: str, event_id: str, conversation_id: str | None = None) -> list[TurnRow]:
        flt = [term("tenant_id", tenant_id), term("event_id", event_id)]
        if conversation_id is not None:
            flt.append(term("conversation_id", conversation_id))
        return sorted(self._turns(flt), key=lambda t: t.conversation_id)

    def corrections(self, tenant_id: str, conversation_id: str, event_id: str) -> list[TurnRow]:
        rows = self._turns([term("tenant_id", tenant_id), term("conversation_id", conversation_id), term("supersedes", event_id)])
        return order_turns(t for t in rows if t.event_id != event_id)

    # -- ledger writes (call inside _translate) ------------------------------------------
    def _forget_ledger(self, forget: Forget) -> set[tuple[str, str]]:
        """Delete the scope's turns from the ledger; return the conversations touched."""
        touched = {(t.tenant_id, t.conversation_id) for t in self.turns_in_scope(forget)}
        self._os().delete_by_query(index=self.ledger_index, body={"query": {"bool": {"filter": [term("type", "turn"), *ledger_scope(forget)]}}},
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

    def _ledger_removals(self, change: ChangeSet) -> set[tuple[str, str]]:
        """Forgets and turn deletions in the ledger, after the view's own deletes and upserts
        (schemas/ports/views.py ChangeSet); returns the conversations touched."""
        if change.forgets:
            faults.hit("forget-view-written")  # crash tests (schemas/faults.py): the forget's documents written, the ledger not
        touched: set[tuple[str, str]] = set()
        for forget in change.forgets:
            touched |= self._forget_ledger(forget)
            if forget.scope.conversation_id is not None:
                touched.add((forget.tenant_id, forget.scope.conversation_id))
        touched |= self._delete_turns(change.delete_turns)
        return touched

    def _commit(self, touched: set[tuple[str, str]], positions: Positions, change: ChangeSet | None = None) -> None:
        """Make the change set visible, record the erasure it needs (if it forgets or deletes
        turns), bump versions, then record the positions (last)."""
        faults.hit("view-written")  # crash tests (schemas/faults.py): documents written, positions not
        client = self._os()
        client.indices.refresh(index=",".join([*self._document_indices(), self.ledger_index]))
        if change is not None and (change.forgets or change.delete_turns):
            self._record_erasure()
        self._bulk([{"_op_type": "index", "_index": self.ledger_index, "_id": _conv_doc_id(t, c),
                     "_source": {"type": "conv", "tenant_id": t, "conversation_id": c}} for t, c in sorted(touched)], "bumping versions")
        # A partial `update` merges into the stored map: partitions not named keep their offset.
        self._bulk([{"_op_type": "update", "_index": self.ledger_index, "_id": POSITIONS_ID,
                     "_source": {"type": "positions", "positions": {str(p): o for p, o in positions.items()}}}], "writing positions")
        client.indices.refresh(index=self.ledger_index)

    # -- erasure (module docstring; schemas/ports/views.py) --------------------------------
    erasure_deferred_seconds = 60.0  # the bound: the 30 s lease sync, the merge and the runner's polling, with margin

    def _shards(self, index: str) -> dict[str, list[dict]]:
        """Shard number -> the stats of its copies (seq_no, retention_leases)."""
        stats = self._os().indices.stats(index=index, level="shards", metric="docs")
        return stats["indices"][index]["shards"]

    def _pending(self) -> dict:
        if self._erasure is None:
            resp = self._os().get(index=self.ledger_index, id=ERASURE_ID, ignore=404)
            self._erasure = resp["_source"] if resp.get("found") else {"targets": {}, "since": None}
        return self._erasure

    def _save_erasure(self, pending: dict) -> None:
        self._bulk([{"_op_type": "index", "_index": self.ledger_index, "_id": ERASURE_ID,
                     "_source": {"type": "erasure", **pending}}], "recording a pending erasure")
        self._erasure = pending

    def _record_erasure(self) -> None:
        """Note, per index and shard, the highest sequence number written so far: every delete of
        this change set is at or below it (call after the writes, before the positions)."""
        pending = self._pending()
        targets = {i: dict(shards) for i, shards in pending["targets"].items()}
        for index in (*self._document_indices(), self.ledger_index):
            for shard, copies in self._shards(index).items():
                seq = max(c["seq_no"]["max_seq_no"] for c in copies)
                targets.setdefault(index, {})[shard] = max(seq, targets.get(index, {}).get(shard, -1))
        self._save_erasure({"targets": targets, "since": pending["since"] or time.time()})

    def _due(self, index: str, shards: dict[str, int]) -> bool:
        """Whether every retention lease of every copy of the index's shards has passed the
        recorded sequence numbers (a merge can then drop the deleted documents)."""
        got = self._shards(index)
        for shard, seq in shards.items():
            leases = [lease["retaining_seq_no"] for c in got.get(shard, []) for lease in c.get("retention_leases", {}).get("leases", [])]
            if not leases or min(leases) <= seq:
                return False
        return True

    def erase_pending(self) -> float | None:
        """None when every forget so far is erased from the cluster's files; else the seconds
        until `erase_due()` can make progress (0: now; a poll hint, at least 1 s otherwise)."""
        with self._lock, self._translate("reading the pending erasure"):
            pending = self._pending()
            if not pending["targets"]:
                return None
            if any(self._due(i, s) for i, s in pending["targets"].items()):
                return 0.0
            return max(1.0, pending["since"] + LEASE_SYNC_SECONDS - time.time())

    def erase_due(self) -> float | None:
        """Expunge deleted documents from every index whose retention leases have passed the
        recorded deletes (forced merge, refresh, flush); returns `erase_pending()` afterwards."""
        with self._lock, self._translate("erasing deleted documents"):
            pending = self._pending()
            left = {}
            client = self._os()
            for index, shards in sorted(pending["targets"].items()):
                if not self._due(index, shards):
                    left[index] = shards
                    continue
                client.indices.forcemerge(index=index, only_expunge_deletes=True, request_timeout=600)
                client.indices.refresh(index=index)
                client.indices.flush(index=index)
            if left != pending["targets"]:
                self._save_erasure({"targets": left, "since": pending["since"] if left else None})
                if not left:  # the erasure record's own write is in the ledger: nothing of it needs erasing
                    client.indices.refresh(index=self.ledger_index)
        return self.erase_pending()
