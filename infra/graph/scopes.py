"""The embedded graph view's structure for bounded walks, kept in memory and maintained per context.

One structure per scope — (tenant, conversation), or (tenant, None) for a walk across the tenant's
conversations — made on the first bounded walk of the scope and then updated with each context
(turn) whose mentions or session adjacency a batch changed (SqliteGraphStore reads them from its
change table), never rebuilt because the conversation moved on. It holds what a walk's
neighbourhood is made of and what SQL would otherwise read per question, growing with the
boundary: every context's node mentions, each entity's contexts (its degree, and its strongest
mentions once asked for), and the adjacency rows touching each context.

The store keeps its scopes in a schemas/sized_lru.py SizedLRU bounded by `max_contexts` contexts
in all (least recently walked dropped first, made again on their next walk): memory is bounded by
that setting. Nothing here is
written to a file, so a forget is erased from every file by the store's own transaction.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

PlaceRow = tuple  # (context id, session id, agent id, occurred_at ISO): where a context is, for boundaries that set them
MentionRow = tuple  # (context id, entity id, label, weight): node kinds only
EdgeRow = tuple  # (source, target): a session adjacency row as stored


class GraphScope:
    """The contexts of one scope with their node mentions and adjacency rows."""

    def __init__(self) -> None:
        self.contexts: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # context -> (entity positions, weights)
        self.edges: dict[str, set[EdgeRow]] = {}  # context -> adjacency rows with it as source or target
        self.places: dict[str, tuple[str, str, str]] = {}  # context -> (session, agent, occurred_at)
        self.entity_pos: dict[str, int] = {}
        self.entity_ids: list[str] = []
        self.labels: list[str] = []
        self.members: list[dict[str, float]] = []  # by entity position: context -> weight
        self.degree = np.zeros(0, np.int64)  # by entity position: len(members)
        self._ranked: dict[int, list[str]] = {}  # entity position -> its contexts, strongest first (while unchanged)

    def __len__(self) -> int:
        return len(self.contexts)

    # -- writes ----------------------------------------------------------------------------
    def _entity(self, entity_id: str, label: str) -> int:
        pos = self.entity_pos.get(entity_id)
        if pos is None:
            pos = self.entity_pos[entity_id] = len(self.entity_ids)
            self.entity_ids.append(entity_id)
            self.labels.append(label)
            self.members.append({})
            if pos >= len(self.degree):
                self.degree = np.concatenate([self.degree, np.zeros(max(1024, len(self.degree)), np.int64)])
        return pos

    def put(self, places: Iterable[PlaceRow], mentions: Iterable[MentionRow], edges: Iterable[EdgeRow]) -> None:
        """Set these contexts to exactly the given mentions and adjacency rows (replacing what they had)."""
        places = list(places)
        ids = [p[0] for p in places]
        self.drop(ids)
        self.places.update((cid, (session, agent, at)) for cid, session, agent, at in places)
        by_context: dict[str, list[tuple[int, float]]] = {c: [] for c in ids}
        for cid, eid, label, weight in mentions:
            if cid not in by_context:  # a mention whose turn the ledger no longer holds
                continue
            pos = self._entity(eid, label)
            by_context[cid].append((pos, float(weight)))
            self.members[pos][cid] = float(weight)
            self.degree[pos] += 1
            self._ranked.pop(pos, None)
        for cid, found in by_context.items():
            found.sort(key=lambda m: self.entity_ids[m[0]])  # entity-id order, as the rows are read
            self.contexts[cid] = (np.fromiter((p for p, _ in found), np.int64, len(found)),
                                  np.fromiter((w for _, w in found), np.float64, len(found)))
            self.edges[cid] = set()
        for s, t in edges:
            for c in (s, t):
                if c in self.edges:
                    self.edges[c].add((s, t))

    def relabel(self, labels: dict[str, str]) -> None:
        """Entities named again since they were forgotten: their label is the new row's."""
        for eid, label in labels.items():
            pos = self.entity_pos.get(eid)
            if pos is not None:
                self.labels[pos] = label

    def drop(self, context_ids: Iterable[str]) -> None:
        for cid in context_ids:
            found = self.contexts.pop(cid, None)
            self.edges.pop(cid, None)
            self.places.pop(cid, None)
            if found is None:
                continue
            for pos in found[0].tolist():
                if self.members[pos].pop(cid, None) is not None:
                    self.degree[pos] -= 1
                    self._ranked.pop(pos, None)

    # -- reads -----------------------------------------------------------------------------
    def content(self) -> dict:
        """What the scope holds, independent of the order it was built in (the contract suite
        compares a maintained scope with one loaded afresh)."""
        return {
            "contexts": {c: sorted((self.entity_ids[p], self.labels[p], w) for p, w in zip(e.tolist(), ws.tolist()))
                         for c, (e, ws) in self.contexts.items()},
            "edges": {c: sorted(found) for c, found in self.edges.items()},
            "places": dict(self.places),
            "degrees": {self.entity_ids[p]: int(self.degree[p]) for p in range(len(self.entity_ids)) if self.degree[p]},
        }

    def degree_of(self, entity_id: str) -> int:
        pos = self.entity_pos.get(entity_id)
        return 0 if pos is None else int(self.degree[pos])

    def strongest(self, entity_id: str, limit: int, admits: Callable[[str], bool] | None = None) -> list[str]:
        """The entity's `limit` strongest contexts (weight descending, then context id) of those
        `admits` lets in (all when None)."""
        pos = self.entity_pos.get(entity_id)
        if pos is None:
            return []
        ranked = self._ranked.get(pos)
        if ranked is None:
            ranked = self._ranked[pos] = sorted(self.members[pos], key=lambda c: (-self.members[pos][c], c))
        if admits is None:
            return ranked[:limit]
        out = []
        for c in ranked:
            if admits(c):
                out.append(c)
                if len(out) == limit:
                    break
        return out
