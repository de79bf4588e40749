"""Data key store on OpenSearch: `<prefix>-datakeys`, one document per event's key, for
deployments whose processes run on several machines (every publisher, projection and eraser
reads the same keys).

Writes are visible when they return (`refresh=wait_for`): a worker that reads a sealed record
finds its key. A key id that exists keeps its first secret (`create` fails on an existing id,
which is what "first wins" needs); a destroyed key's document is overwritten by its tombstone.

Erasure: OpenSearch keeps a deleted or overwritten document's old version (soft delete) until
the shard's peer-recovery retention lease has moved past it — OpenSearch advances that lease on
its own about every 30 s, not configurable — and then only a merge removes it. So a destroy
records what it overwrote, and a background thread runs `_forcemerge?only_expunge_deletes=true`,
a refresh (the old segment's files go when no reader holds them) and a flush once the lease has
passed it: the secrets' bytes leave the data directory within
`erasure_deferred_seconds` (measured ~30–40 s). The index allows it: expunge considers every
segment with a deleted document (`index.merge.policy.expunge_deletes_allowed: 0`).
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from datetime import datetime, timezone
from typing import Iterable

from infra.opensearch_base import connect, found_docs, translated
from schemas.ports.keystore import DataKey, EventRef, Tombstone
from schemas.ports.views import Positions

log = logging.getLogger(__name__)
_POSITIONS = "_positions"
_MAPPING = {
    "dynamic": "strict",
    "properties": {
        "type": {"type": "keyword"}, "key_id": {"type": "keyword"}, "tenant_id": {"type": "keyword"}, "conversation_id": {"type": "keyword"},
        "event_id": {"type": "keyword"}, "secret": {"type": "binary"}, "created_at": {"type": "double"},
        "destroyed_at": {"type": "double"}, "forget_id": {"type": "keyword"},
        "positions": {"type": "object", "enabled": False},
    },
}
_SETTINGS = {"number_of_shards": 1, "number_of_replicas": 0, "index.merge.policy.expunge_deletes_allowed": 0,
             "index.soft_deletes.retention_lease.period": "1s"}


class OpenSearchKeyStore:
    backend = "opensearch"
    erasure_deferred_seconds = 45.0

    def __init__(self, url: str, prefix: str = "memstream", **client_options):
        self.url = url
        self.index = f"{prefix}-datakeys"
        self._options = client_options
        self._client = None
        self._ready = False
        self._lock = threading.Lock()
        self._pending_seq: int | None = None  # highest sequence number a destroy overwrote, not yet expunged
        self._cond = threading.Condition()
        self._eraser: threading.Thread | None = None
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------------
    def _os(self):
        with self._lock:
            if self._client is None:
                self._client = connect(self.url, **self._options)
            if not self._ready:
                with translated(self.url, "creating the data key index"):
                    if not self._client.indices.exists(index=self.index):
                        try:
                            self._client.indices.create(index=self.index, body={"settings": _SETTINGS, "mappings": _MAPPING})
                        except Exception:
                            if not self._client.indices.exists(index=self.index):  # a real failure, not a lost race
                                raise
                self._ready = True
            return self._client

    def start(self) -> None:
        self._os()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._eraser is not None:
            self._eraser.join(timeout=60)
        with self._lock:
            if self._client is not None:
                self._client.close()
            self._client = None

    # -- writes ---------------------------------------------------------------------------------
    def put(self, keys: Iterable[DataKey]) -> dict[str, DataKey]:
        keys = list({k.key_id: k for k in keys}.values())
        if not keys:
            return {}
        client, now = self._os(), time.time()
        body = []
        for k in keys:
            body.append({"create": {"_index": self.index, "_id": k.key_id}})
            body.append({"type": "key", "key_id": k.key_id, "tenant_id": k.tenant_id, "conversation_id": k.conversation_id, "event_id": k.event_id,
                         "secret": base64.b64encode(k.secret).decode(), "created_at": now})
        with translated(self.url, "storing data keys"):
            resp = client.bulk(body=body, refresh="wait_for")
            bad = [i["create"] for i in resp["items"] if "error" in i["create"] and i["create"].get("status") != 409]
            if bad:
                raise RuntimeError(f"{len(bad)} data keys not stored: {bad[0]['error']}")
        return self.get([k.key_id for k in keys])

    def destroy(self, events: Iterable[EventRef], forget_id: str, *, positions: Positions | None = None) -> list[Tombstone]:
        refs = {e.key_id: e for e in events}
        client, now = self._os(), time.time()
        with translated(self.url, "destroying data keys"):
            done = set(self.destroyed(refs))
            fresh = [(k, e) for k, e in sorted(refs.items()) if k not in done]
            body: list[dict] = []
            for k, e in fresh:
                body.append({"index": {"_index": self.index, "_id": k}})
                body.append({"type": "tombstone", "key_id": k, "tenant_id": e.tenant_id, "conversation_id": e.conversation_id, "event_id": e.event_id,
                             "created_at": now, "destroyed_at": now, "forget_id": forget_id})
            if positions:
                body.append({"update": {"_index": self.index, "_id": _POSITIONS}})
                body.append({"doc": {"type": "positions", "positions": {str(p): o for p, o in positions.items()}}, "doc_as_upsert": True})
            if body:
                resp = client.bulk(body=body, refresh="wait_for")
                if resp.get("errors"):
                    first = next(v for item in resp["items"] for v in item.values() if "error" in v)
                    raise RuntimeError(f"data keys not destroyed: {first['error']}")
                if fresh:
                    seq = max(v["_seq_no"] for item in resp["items"] for v in item.values() if "_seq_no" in v)
                    self._schedule_expunge(seq)
        return [Tombstone(k, e.tenant_id, e.conversation_id, e.event_id, datetime.fromtimestamp(now, timezone.utc), forget_id) for k, e in fresh]

    def write_positions(self, positions: Positions) -> None:
        if not positions:
            return
        with translated(self.url, "writing the eraser's positions"):
            self._os().update(index=self.index, id=_POSITIONS, refresh="wait_for",
                              body={"doc": {"type": "positions", "positions": {str(p): o for p, o in positions.items()}}, "doc_as_upsert": True})

    # -- erasure --------------------------------------------------------------------------------
    def _schedule_expunge(self, seq: int) -> None:
        with self._cond:
            self._pending_seq = max(seq, self._pending_seq or -1)
            if self._eraser is None or not self._eraser.is_alive():
                self._eraser = threading.Thread(target=self._expunge_loop, name="datakeys-expunge", daemon=True)
                self._eraser.start()
            self._cond.notify_all()

    def erasure_pending(self) -> bool:
        return self._pending_seq is not None

    def _expunge_loop(self) -> None:
        while True:
            with self._cond:
                while self._pending_seq is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                target = self._pending_seq
            try:
                if self._lease(target):
                    client = self._os()
                    client.indices.forcemerge(index=self.index, only_expunge_deletes=True)
                    # The merged-away segment's files are deleted only once no reader holds them:
                    # refresh (a search-idle shard skips its scheduled refreshes), then commit.
                    client.indices.refresh(index=self.index)
                    client.indices.flush(index=self.index, force=True)
                    with self._cond:
                        if self._pending_seq == target:
                            self._pending_seq = None
                    continue
            except Exception as exc:  # noqa: BLE001 - retried; the keys are already unreadable
                log.warning("data key store: expunge of destroyed keys failed (%s); retrying", exc)
            with self._cond:
                self._cond.wait(timeout=2.0)

    def _lease(self, seq: int) -> bool:
        """Whether every retention lease of the shard has moved past `seq` (then a merge can drop
        the overwritten versions)."""
        stats = self._os().indices.stats(index=self.index, level="shards")
        shards = stats["indices"][self.index]["shards"]["0"]
        leases = [lease["retaining_seq_no"] for copy in shards for lease in copy.get("retention_leases", {}).get("leases", [])]
        return bool(leases) and min(leases) > seq

    # -- reads ----------------------------------------------------------------------------------
    def _docs(self, key_ids: Iterable[str]) -> list[dict]:
        with translated(self.url, "reading data keys"):
            return found_docs(self._os(), self.index, list(key_ids), ["type", "tenant_id", "conversation_id", "event_id", "secret",
                                                                        "destroyed_at", "forget_id"])

    def get(self, key_ids: Iterable[str]) -> dict[str, DataKey]:
        out = {}
        for d in self._docs(key_ids):
            s = d["_source"]
            if s.get("type") == "key":
                out[d["_id"]] = DataKey(d["_id"], s["tenant_id"], s["conversation_id"], s["event_id"], base64.b64decode(s["secret"]))
        return out

    def destroyed(self, key_ids: Iterable[str]) -> dict[str, Tombstone]:
        out = {}
        for d in self._docs(key_ids):
            s = d["_source"]
            if s.get("type") == "tombstone":
                out[d["_id"]] = Tombstone(d["_id"], s["tenant_id"], s["conversation_id"], s["event_id"],
                                          datetime.fromtimestamp(s["destroyed_at"], timezone.utc), s["forget_id"])
        return out

    def positions(self) -> Positions:
        with translated(self.url, "reading the eraser's positions"):
            resp = self._os().get(index=self.index, id=_POSITIONS, ignore=404)
        return {int(p): int(o) for p, o in resp["_source"]["positions"].items()} if resp.get("found") else {}

    def tombstones(self, tenant_id: str, *, after: str | None = None, limit: int = 1000) -> list[Tombstone]:
        query = {"bool": {"filter": [{"term": {"type": "tombstone"}}, {"term": {"tenant_id": tenant_id}}]}}
        body = {"query": query, "size": limit, "sort": [{"key_id": "asc"}]}
        if after:
            body["search_after"] = [after]
        with translated(self.url, "listing tombstones"):
            hits = self._os().search(index=self.index, body=body)["hits"]["hits"]
        return [Tombstone(h["_id"], h["_source"]["tenant_id"], h["_source"]["conversation_id"], h["_source"]["event_id"],
                          datetime.fromtimestamp(h["_source"]["destroyed_at"], timezone.utc), h["_source"]["forget_id"]) for h in hits]

    def canonical_dump(self) -> dict:
        from opensearchpy import helpers

        with translated(self.url, "dumping data keys"):
            docs = list(helpers.scan(self._os(), index=self.index, query={"query": {"terms": {"type": ["key", "tombstone"]}}},
                                     _source=["tenant_id", "conversation_id", "event_id", "type"]))
        rows = sorted(({"key_id": d["_id"], "tenant": d["_source"]["tenant_id"], "conversation": d["_source"]["conversation_id"],
                        "event_id": d["_source"]["event_id"], "destroyed": d["_source"]["type"] == "tombstone"} for d in docs),
                      key=lambda r: r["key_id"])
        return {"keys": rows}
