"""Distributed dense view: turn, window, episode and sentence vectors in Qdrant.

One generation is five collections (naming, ids, write order and visibility in
infra/qdrant_base.py): `<prefix>-dense-g<N>-{turn,window,episode,sentence}` with cosine
distance, created on the first upsert (their dimension is the first vector's), and
`<prefix>-dense-g<N>-ledger`, points without vectors holding the turn ledger (its text sealed
with each turn's data key: infra/qdrant_base.py), the pooling
state (float32 bytes, base64: exact, and the mean is unnormalised, which a cosine collection
would normalise), the conversation versions and the positions.

Scores are Qdrant's cosine similarities. Searches ask for exact search (`exact=True`): a
boundary holds hundreds to thousands of points, where exact search is cheap and returns every
admissible point, which `score_units` needs (HNSW with a selective filter may miss some). The
server finds a boundary's points through the keyword payload indexes (tenant, conversation, …)
and scores them by brute force, so the collections are made without an HNSW graph (`m=0`):
building one would spend the machine's cores during ingest on an index no query reads.

The bounded query path's reads: `nearest` is the same filtered search with the caller's limit
(only `limit` points travel back; without an HNSW graph the server still scores every admissible
point, which is cheap at these sizes), `score_points` a search restricted to the named point ids,
so its scores are computed exactly as `score_units`' are.
"""

from __future__ import annotations

import base64
from collections import defaultdict

import numpy as np
from qdrant_client import QdrantClient, models
from qdrant_client import grpc as qgrpc
from qdrant_client.conversions.conversion import RestToGrpc

from infra.qdrant_base import (QdrantViewBase, boundary_filter, grpc_points, is_local, ledger_conditions, match, match_any, point_uuid,
                               scope_conditions, upsert)
from infra.turn_docs import micros
from schemas import faults
from schemas.ports.vectors import COLLECTIONS, Collection, TurnPooling, VectorChangeSet, VectorPoint
from schemas.ports.views import Boundary, Forget, Hit, Positions, TurnRow
from schemas.sealing import TextSealer
from schemas.units import unit_key

_BATCH = 256
# A read of every admissible point asks for this many at once and counts only when the answer is
# full (a boundary holds hundreds to thousands of points): no count round trip per read. A larger
# limit costs Qdrant nothing measurable up to ~100k (the heap is sized by the hits, not the limit).
_ALL = 65_536
_KEY_MEMO = 250_000  # point id -> unit key pairs kept (~40 MB at most; cleared when full): ~100 conversations' points
_POINT_INDEXES = {
    **{name: models.PayloadSchemaType.KEYWORD for name in ("tenant_id", "conversation_id", "session_id", "agent_id", "owner_id")},
    "occurred_from": models.PayloadSchemaType.INTEGER, "occurred_to": models.PayloadSchemaType.INTEGER,
}


def _payload(p: VectorPoint) -> dict:
    return {
        "point_id": p.point_id, "key": unit_key(p.point_id), "tenant_id": p.tenant_id, "conversation_id": p.conversation_id,
        "session_id": p.session_id, "agent_id": list(p.agent_ids), "owner_id": p.owner_id,
        "occurred_from": micros(p.occurred_from), "occurred_to": micros(p.occurred_to),  # microseconds, for range filters
        "from": p.occurred_from.isoformat(), "to": p.occurred_to.isoformat(),  # as given, for the canonical dump
    }


def _pooling_point(p: TurnPooling) -> models.PointStruct:
    mean = base64.b64encode(np.asarray(p.mean, np.float32).tobytes()).decode("ascii")
    return models.PointStruct(id=point_uuid("pooling", p.turn_id), vector={}, payload={"type": "pooling", "turn_id": p.turn_id, "tokens": p.tokens, "mean": mean})


class QdrantVectorStore(QdrantViewBase):
    view = "dense"

    def __init__(self, location: str | QdrantClient, prefix: str, generation: int, *, sealer: TextSealer, exact: bool = True):
        super().__init__(location, prefix, generation, sealer=sealer)
        self.exact = exact
        self.page = _ALL  # points asked for before counting (a test lowers it to reach the counted path)
        self._key_of: dict[str, int] = {}  # point id (uuid) -> unit key: _keyed

    def _name(self, collection: Collection) -> str:
        return f"{self.base}-{collection}"

    @property
    def dim(self) -> int:
        with self._translate("reading the vector dimension"):
            for c in COLLECTIONS:
                if self._exists(self._name(c)):
                    return int(self._connection().get_collection(self._name(c)).config.params.vectors.size)
        return 0

    # -- writes --------------------------------------------------------------------------
    def apply(self, change: VectorChangeSet, positions: Positions) -> None:
        with self._lock, self._translate("applying a dense change set"):
            client = self._qd()
            touched: set[tuple[str, str]] = set()
            for forget in change.forgets:
                turns = self._turns(ledger_conditions(forget), opened=False)  # ids are enough
                self._forget_points(forget, turns)  # points first: they are found through the ledger
                touched.update((t.tenant_id, t.conversation_id) for t in turns)
                if forget.scope.conversation_id is not None:
                    touched.add((forget.tenant_id, forget.scope.conversation_id))
            deletes: dict[str, list[str]] = defaultdict(list)
            for collection, pid in change.delete_points:
                deletes[collection].append(point_uuid(pid))
            for collection, ids in deletes.items():
                if self._exists(self._name(collection)):
                    found = client.retrieve(self._name(collection), ids, with_payload=["tenant_id", "conversation_id"])
                    touched.update((p.payload["tenant_id"], p.payload["conversation_id"]) for p in found)
                    client.delete(self._name(collection), models.PointIdsList(points=ids), wait=True)
            upserts: dict[str, list[VectorPoint]] = defaultdict(list)
            for p in change.upsert_points:
                upserts[p.collection].append(p)
            for collection, points in upserts.items():
                name = self._name(collection)
                self._create(name, models.VectorParams(size=len(points[0].vector), distance=models.Distance.COSINE), _POINT_INDEXES,
                             hnsw_config=models.HnswConfigDiff(m=0) if self.exact else None)
                for i in range(0, len(points), _BATCH):
                    upsert(client, name, [
                        models.PointStruct(id=point_uuid(p.point_id), vector=np.asarray(p.vector, np.float32).tolist(), payload=_payload(p))
                        for p in points[i:i + _BATCH]
                    ])
                touched.update((p.tenant_id, p.conversation_id) for p in points)
            # The ledger last (schemas/ports/views.py ChangeSet): a turn found there has its points,
            # and a forgotten or deleted turn leaves it only once its sessions' points are rewritten.
            if change.forgets:
                faults.hit("forget-view-written")  # crash tests (schemas/faults.py): the forget's points written, the ledger not
            for forget in change.forgets:
                self._forget_ledger(forget)
            if change.delete_turns:
                touched |= self._delete_turns(change.delete_turns)
                client.delete(self.ledger, models.PointIdsList(points=[point_uuid("pooling", t) for t in change.delete_turns]), wait=True)
            for i in range(0, len(change.pooling), _BATCH):
                upsert(client, self.ledger, [_pooling_point(p) for p in change.pooling[i:i + _BATCH]])
            touched |= self._put_turns(change.put_turns)
            self._commit(touched, positions)

    def _forget_points(self, forget: Forget, turns: list[TurnRow]) -> None:
        client = self._connection()
        if turns:
            client.delete(self.ledger, models.PointIdsList(points=[point_uuid("pooling", t.turn_id) for t in turns]), wait=True)
        if forget.scope.partial:
            # The turns' own points; the projection recomputes their sessions' windows/episodes.
            if not turns:
                return
            flt = models.Filter(must=[match("tenant_id", forget.tenant_id), match_any("owner_id", [t.turn_id for t in turns])])
            collections: tuple[Collection, ...] = ("turn", "sentence")
        else:
            flt, collections = models.Filter(must=scope_conditions(forget)), COLLECTIONS
        for c in collections:
            if self._exists(self._name(c)):
                client.delete(self._name(c), models.FilterSelector(filter=flt), wait=True)

    # -- reads ---------------------------------------------------------------------------
    def pooling(self, turn_ids: list[str]) -> dict[str, TurnPooling]:
        if not turn_ids:
            return {}
        with self._translate("reading pooling state"):
            got = self._qd().retrieve(self.ledger, [point_uuid("pooling", t) for t in dict.fromkeys(turn_ids)])
        return {
            p.payload["turn_id"]: TurnPooling(p.payload["turn_id"], np.frombuffer(base64.b64decode(p.payload["mean"]), dtype=np.float32).copy(), p.payload["tokens"])
            for p in got
        }

    def _query(self, collection: Collection, vector: np.ndarray, boundary: Boundary, limit: int | None, payload: list[str]):
        name, flt = self._name(collection), boundary_filter(boundary)
        if flt is None or not self._exists(name):
            return []
        client = self._connection()
        q = np.asarray(vector, dtype=np.float32).reshape(-1).tolist()
        params = None if is_local(client) else models.SearchParams(exact=self.exact)
        if limit is None:  # every admissible point
            points = client.query_points(name, query=q, query_filter=flt, limit=self.page, with_payload=payload, search_params=params).points
            if len(points) < self.page:
                return points
            limit = client.count(name, count_filter=flt, exact=True).count
        if limit <= 0:
            return []
        return client.query_points(name, query=q, query_filter=flt, limit=limit, with_payload=payload, search_params=params).points

    def _score_all_grpc(self, stub, requests: list[tuple[Collection, np.ndarray]], boundary: Boundary) -> list[tuple[np.ndarray, np.ndarray]]:
        """score_units straight on the gRPC stub (grpc_points: no per-hit model objects), every
        request in flight at once: the server scores them side by side on its cores while the
        answers of the first ones are decoded here."""
        flt = boundary_filter(boundary)
        gflt = None if flt is None else RestToGrpc.convert_filter(flt)
        timeout = self._connection().init_options.get("timeout") or 30

        def query(name: str, vector: np.ndarray, limit: int):
            return stub.Query.future(qgrpc.QueryPoints(
                collection_name=name, filter=gflt, params=qgrpc.SearchParams(exact=self.exact), limit=limit,
                query=qgrpc.Query(nearest=qgrpc.VectorInput(dense=qgrpc.DenseVector(data=np.asarray(vector, np.float32).reshape(-1).tolist()))),
                with_payload=qgrpc.WithPayloadSelector(enable=False)), timeout=timeout)

        live = [gflt is not None and self._exists(self._name(c)) for c, _ in requests]
        pending = [query(self._name(c), v, self.page) if ok else None for (c, v), ok in zip(requests, live)]
        out = []
        for (collection, vector), future in zip(requests, pending):
            if future is None:
                out.append((np.zeros(0, np.int64), np.zeros(0)))
                continue
            hits = future.result().result
            if len(hits) >= self.page:  # a full page: count, and ask for all of them
                count = self._connection().count(self._name(collection), count_filter=flt, exact=True).count
                hits = query(self._name(collection), vector, max(count, 1)).result().result
            out.append(self._keyed(self._name(collection), [h.id.uuid for h in hits], [h.score for h in hits]))
        return out

    def _keyed(self, name: str, uuids: list[str], scores: list[float]) -> tuple[np.ndarray, np.ndarray]:
        """(unit keys, scores) of hits that came back as point ids alone. A point's id and its
        unit key are both fixed functions of its unit id, so the pairing is remembered for good
        (bounded); ids not seen before have their `key` payload read once. Reading the payload
        with every hit was most of the server's time for a boundary (2,000 hits: ~8 of 13 ms)."""
        memo = self._key_of
        found = {u: k for u in uuids if (k := memo.get(u)) is not None}
        missing = [u for u in uuids if u not in found]
        if missing:
            fetched = {str(p.id): int(p.payload["key"]) for p in self._connection().retrieve(name, missing, with_payload=["key"])}
            found.update(fetched)
            if len(memo) + len(fetched) > _KEY_MEMO:
                memo.clear()
            memo.update(fetched)
        keep = [i for i, u in enumerate(uuids) if u in found]  # a point deleted since it was scored is dropped
        return (np.fromiter((found[uuids[i]] for i in keep), dtype=np.int64, count=len(keep)),
                np.fromiter((scores[i] for i in keep), dtype=float, count=len(keep)))

    def search(self, collection: Collection, vector: np.ndarray, boundary: Boundary, k: int) -> list[Hit]:
        with self._translate("searching vectors"):
            points = self._query(collection, vector, boundary, max(k, 0), ["point_id"])
        hits = [Hit(p.payload["point_id"], float(p.score)) for p in points]
        hits.sort(key=lambda h: (-h.score, h.unit_id))
        return hits

    def score_units(self, collection: Collection, vector: np.ndarray, boundary: Boundary) -> tuple[np.ndarray, np.ndarray]:
        return self.score_units_many([(collection, vector)], boundary)[0]

    def score_units_many(self, requests: list[tuple[Collection, np.ndarray]], boundary: Boundary) -> list[tuple[np.ndarray, np.ndarray]]:
        with self._translate("scoring vectors"):
            if (stub := grpc_points(self._connection())) is not None:
                return self._score_all_grpc(stub, requests, boundary)
            out = []
            for collection, vector in requests:  # REST and local mode: one after the other
                points = self._query(collection, vector, boundary, None, ["key"])
                out.append((np.asarray([p.payload["key"] for p in points], dtype=np.int64), np.asarray([p.score for p in points], dtype=float)))
            return out

    # -- the bounded query path's reads (schemas/ports/vectors.py) -----------------------------
    def nearest(self, collection: Collection, vector: np.ndarray, boundary: Boundary,
                limit: int) -> tuple[np.ndarray, np.ndarray]:
        """The server's filtered search with a limit: only `limit` points travel back. Best
        first, ties by key (the embedded store's order)."""
        with self._translate("searching nearest vectors"):
            points = self._query(collection, vector, boundary, max(int(limit), 0), ["key"])
        keys = np.fromiter((p.payload["key"] for p in points), dtype=np.int64, count=len(points))
        scores = np.fromiter((p.score for p in points), dtype=float, count=len(points))
        order = np.lexsort((keys, -scores))
        return keys[order], scores[order]

    def score_points(self, collection: Collection, vector: np.ndarray, boundary: Boundary,
                     point_ids: list[str]) -> dict[str, float]:
        """A query restricted to the named points (and the tenant): the server scores them as
        `score_units` does, and no vector travels back. Point ids map back from their uuids."""
        name = self._name(collection)
        by_uuid = {point_uuid(p): p for p in dict.fromkeys(point_ids)}
        if not by_uuid:
            return {}
        client = self._connection()
        q = np.asarray(vector, dtype=np.float32).reshape(-1).tolist()
        params = None if is_local(client) else models.SearchParams(exact=True)
        out: dict[str, float] = {}
        with self._translate("scoring named vectors"):
            if not self._exists(name):
                return {}
            ids = list(by_uuid)
            for i in range(0, len(ids), _ALL):
                chunk = ids[i:i + _ALL]
                flt = models.Filter(must=[match("tenant_id", boundary.tenant_id), models.HasIdCondition(has_id=chunk)])
                for p in client.query_points(name, query=q, query_filter=flt, limit=len(chunk), with_payload=False,
                                             search_params=params).points:
                    out[by_uuid[str(p.id)]] = float(p.score)
        return out

    def vectors(self, collection: Collection, tenant_id: str, point_ids: list[str]) -> dict[str, np.ndarray]:
        name = self._name(collection)
        with self._translate("reading vectors"):
            if not point_ids or not self._exists(name):
                return {}
            got = self._connection().retrieve(name, [point_uuid(p) for p in dict.fromkeys(point_ids)], with_payload=["tenant_id", "point_id"], with_vectors=True)
        return {p.payload["point_id"]: np.asarray(p.vector, dtype=np.float32) for p in got if p.payload["tenant_id"] == tenant_id}

    def session_point_ids(self, collection: Collection, tenant_id: str, conversation_id: str, session_id: str) -> set[str]:
        name = self._name(collection)
        with self._translate("listing a session's points"):
            if not self._exists(name):
                return set()
            flt = models.Filter(must=[match("tenant_id", tenant_id), match("conversation_id", conversation_id), match("session_id", session_id)])
            return {p.payload["point_id"] for p in self._scroll(name, flt, payload=["point_id"])}

    def canonical_dump(self) -> dict:
        """The shape of the SQLite twin's dump (vectors as Qdrant stores them: re-normalised,
        equal within float32 rounding)."""
        points = []
        with self._translate("dumping vectors"):
            for c in COLLECTIONS:
                if not self._exists(self._name(c)):
                    continue
                for p in self._scroll(self._name(c), None, vectors=True):
                    d = p.payload
                    points.append({"collection": c, "id": d["point_id"], "tenant": d["tenant_id"], "conversation": d["conversation_id"],
                                   "session": d["session_id"], "agents": d["agent_id"], "from": d["from"], "to": d["to"], "owner": d["owner_id"],
                                   "vector": np.asarray(p.vector, dtype=np.float32).tolist()})
        points.sort(key=lambda p: (p["collection"], p["id"]))
        return {"view": self.view, "turns": self.ledger_dump(), "points": points}

    def destroy(self) -> None:
        """Delete this generation's collections (reclaiming a retired generation)."""
        with self._translate("deleting collections"):
            for name in [*(self._name(c) for c in COLLECTIONS), self.ledger]:
                if self._exists(name):
                    self._connection().delete_collection(name)
        self.close()
