"""View catalog on OpenSearch: the live generation of a view is the alias `<prefix>-<view>`.

Index naming is infra/opensearch_base.py's. `activate` moves the alias onto every index of the
new generation (`<prefix>-<view>-g<N>`, `…-g<N>-ledger`, …) and off the old ones in one
`_aliases` call, which OpenSearch applies atomically: a reader resolving the alias sees one
generation or the other, never both. `current` reads the alias, so the alias is the truth.

Each generation gets an empty anchor index `<prefix>-<view>-g<N>-anchor` when it is reserved,
so the alias has something to point at even before the view's store has created its indices
(a fresh install activates generation 1 first; stores join the live alias when they create
their indices). A small `<prefix>-catalog` index keeps one document per generation (state,
timestamps); documents are created with op_type=create — two processes reserving at once get
a conflict and the loser takes the next number — and never deleted, so numbers are never
reused. A crash between the alias swap and the state update leaves stale states; readers of
`building`/`retired` resolve them against the alias.
"""

from __future__ import annotations

import threading
import time

from opensearchpy import OpenSearch
from opensearchpy import exceptions as os_exc

from infra.opensearch_base import all_hits, connect, generation_index, generation_of, term, translated, view_alias
from schemas.errors import StoreError
from schemas.ports.views import ViewName

_MAPPINGS = {
    "dynamic": "strict",
    "properties": {"view": {"type": "keyword"}, "generation": {"type": "long"}, "state": {"type": "keyword"},
                   "created_at": {"type": "double"}, "activated_at": {"type": "double"}, "model": {"type": "keyword"}},
}
_TINY = {"index": {"number_of_shards": 1, "number_of_replicas": 0}}


class OpenSearchViewCatalog:
    def __init__(self, url: str, prefix: str, **client_options):
        self.url = url
        self.prefix = prefix
        self.index = f"{prefix}-catalog"
        self._client_options = client_options
        self._client: OpenSearch | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
            self._client = None

    def _os(self) -> OpenSearch:
        with self._lock:
            if self._client is None:
                client = connect(self.url, **self._client_options)
                with translated(self.url, "creating the catalog index"):
                    if not client.indices.exists(index=self.index):
                        try:
                            client.indices.create(index=self.index, body={"settings": _TINY, "mappings": _MAPPINGS})
                        except os_exc.RequestError as exc:
                            if exc.error != "resource_already_exists_exception":
                                raise
                    else:  # a catalog made before generations recorded their model: the field is added in place
                        client.indices.put_mapping(index=self.index, body={"properties": {"model": _MAPPINGS["properties"]["model"]}})
                self._client = client
            return self._client

    # -- reads ---------------------------------------------------------------------------
    def current(self, view: ViewName) -> int | None:
        with translated(self.url, f"resolving the alias of view {view}"):
            client = self._os()
            alias = view_alias(self.prefix, view)
            if not client.indices.exists_alias(name=alias):
                return None
            holders = client.indices.get_alias(name=alias)
        generations = {generation_of(self.prefix, view, i) for i in holders}
        if len(generations) != 1 or None in generations:
            raise StoreError(f"alias {alias} points at {sorted(holders)}, not at one generation of view {view}; "
                             "re-run the activation (memstream replay) or fix the alias with the _aliases API")
        return generations.pop()

    def _records(self, view: ViewName) -> list[dict]:
        with translated(self.url, f"reading the catalog of view {view}"):
            hits = all_hits(self._os(), self.index, {"bool": {"filter": [term("view", view)]}})
        return [h["_source"] for h in hits]

    def _with_state(self, view: ViewName, states: set[str]) -> list[int]:
        live = self.current(view)
        return sorted(r["generation"] for r in self._records(view) if r["state"] in states and r["generation"] != live)

    def building(self, view: ViewName) -> list[int]:
        return self._with_state(view, {"building"})

    def retired(self, view: ViewName) -> list[int]:
        # "live" here means the alias moved on before the state was updated (see above).
        return self._with_state(view, {"live", "retired"})

    def _indices(self, view: ViewName, generation: int) -> list[str]:
        """The generation's existing indices (its anchor and whatever its store created)."""
        base = generation_index(self.prefix, view, generation)
        found = self._os().indices.get(index=f"{base},{base}-*", ignore_unavailable=True, allow_no_indices=True, expand_wildcards="open")
        return sorted(i for i in found if generation_of(self.prefix, view, i) == generation)

    # -- writes --------------------------------------------------------------------------
    def model(self, view: ViewName, generation: int) -> str | None:
        return next((r.get("model") for r in self._records(view) if r["generation"] == generation), None)

    def new_generation(self, view: ViewName, model: str | None = None) -> int:
        with translated(self.url, f"reserving a generation of view {view}"):
            client = self._os()
            found = client.indices.get(index=f"{self.prefix}-{view}-g*", ignore_unavailable=True, allow_no_indices=True, expand_wildcards="all")
            used = [r["generation"] for r in self._records(view)] + [g for g in (generation_of(self.prefix, view, i) for i in found) if g]
            n = max(used, default=0) + 1
            while True:
                try:
                    client.index(index=self.index, id=f"{view}.g{n}", op_type="create", refresh=True,
                                 body={"view": view, "generation": n, "state": "building", "created_at": time.time(), "model": model})
                    break
                except os_exc.ConflictError:  # another process reserved n first
                    n += 1
            client.indices.create(index=f"{generation_index(self.prefix, view, n)}-anchor", body={"settings": _TINY})
        return n

    def activate(self, view: ViewName, generation: int) -> None:
        alias = view_alias(self.prefix, view)
        with translated(self.url, f"activating generation {generation} of view {view}"):
            client = self._os()
            targets = self._indices(view, generation)
            if not targets:
                raise StoreError(f"generation {generation} of view {view} has no indices (never reserved, or dropped); "
                                 "reserve a new one with new_generation (memstream replay)")
            holders = list(client.indices.get_alias(name=alias)) if client.indices.exists_alias(name=alias) else []
            actions = [{"remove": {"index": i, "alias": alias}} for i in holders if i not in targets]
            actions += [{"add": {"index": i, "alias": alias}} for i in targets]
            client.indices.update_aliases(body={"actions": actions})  # atomic: the switch readers see
            previous = {generation_of(self.prefix, view, i) for i in holders} | {
                r["generation"] for r in self._records(view) if r["state"] == "live"}
            now = time.time()
            for g in sorted(previous - {generation, None}):
                client.update(index=self.index, id=f"{view}.g{g}", body={"doc": {"state": "retired"}}, refresh=True)
            client.update(index=self.index, id=f"{view}.g{generation}", refresh=True,
                          body={"doc": {"state": "live", "activated_at": now}, "upsert": {
                              "view": view, "generation": generation, "state": "live", "created_at": now, "activated_at": now}})

    def drop(self, view: ViewName, generation: int) -> None:
        """Delete a non-live generation's indices; its number stays used."""
        if generation == self.current(view):
            return
        with translated(self.url, f"dropping generation {generation} of view {view}"):
            client = self._os()
            indices = self._indices(view, generation)
            if indices:
                client.indices.delete(index=",".join(indices))
            client.update(index=self.index, id=f"{view}.g{generation}", body={"doc": {"state": "dropped"}}, refresh=True, ignore=404)
