"""View catalog on Qdrant: the live generation of a view is what its collection aliases name.

Collection naming is infra/qdrant_base.py's. A Qdrant alias names exactly one collection, so
each collection of a generation gets its own alias without the generation part:
`<prefix>-<view>` -> the generation's anchor `<prefix>-<view>-g<N>` (an empty collection made
when the generation is reserved, so a generation can be activated before its store wrote
anything), `<prefix>-dense-turn` -> `<prefix>-dense-g<N>-turn`, and so on. `activate` deletes
and re-creates all of them in one `update_collection_aliases` call, which Qdrant applies
atomically. `current` reads the `<prefix>-<view>` alias, so the aliases are the truth.

A `<prefix>-catalog` collection (no vectors) keeps one point per generation with its state;
points are never deleted, so numbers are never reused. Reserving a number is creating its
anchor collection, which fails if another process created it first (the loser takes the next
number).
"""

from __future__ import annotations

import threading
import time

from qdrant_client import QdrantClient, models

from infra.qdrant_base import alias_name, generation_name, generation_of, match, open_client, point_uuid, translated, upsert
from schemas.errors import StoreError
from schemas.ports.views import ViewName


class QdrantViewCatalog:
    def __init__(self, location: str | QdrantClient, prefix: str):
        self.location = location
        self.prefix = prefix
        self.collection = f"{prefix}-catalog"
        self._client: QdrantClient | None = None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            if self._client is not None and isinstance(self.location, str):
                self._client.close()  # a client handed in belongs to the caller
            self._client = None

    def _qd(self) -> QdrantClient:
        with self._lock:
            if self._client is None:
                with translated(self.location, "opening the catalog"):
                    client = open_client(self.location)
                    if not client.collection_exists(self.collection):
                        client.create_collection(self.collection, vectors_config={})
                self._client = client
            return self._client

    # -- reads ---------------------------------------------------------------------------
    def _aliases(self) -> dict[str, str]:
        return {a.alias_name: a.collection_name for a in self._qd().get_aliases().aliases}

    def current(self, view: ViewName) -> int | None:
        with translated(self.location, f"resolving the aliases of view {view}"):
            target = self._aliases().get(alias_name(self.prefix, view, ""))
        if target is None:
            return None
        parsed = generation_of(self.prefix, view, target)
        if parsed is None:
            raise StoreError(f"alias {alias_name(self.prefix, view, '')} names {target}, not a generation of view {view}; "
                             "re-run the activation (memstream replay) or fix the alias")
        return parsed[0]

    def _records(self, view: ViewName) -> list[dict]:
        client, out, offset = self._qd(), [], None
        while True:
            page, offset = client.scroll(self.collection, scroll_filter=models.Filter(must=[match("view", view)]), limit=1_000, offset=offset)
            out.extend(p.payload for p in page)
            if offset is None:
                return out

    def _with_state(self, view: ViewName, states: set[str]) -> list[int]:
        live = self.current(view)
        with translated(self.location, f"reading the catalog of view {view}"):
            return sorted(r["generation"] for r in self._records(view) if r["state"] in states and r["generation"] != live)

    def building(self, view: ViewName) -> list[int]:
        return self._with_state(view, {"building"})

    def retired(self, view: ViewName) -> list[int]:
        # "live" here means the aliases moved on before the state was updated.
        return self._with_state(view, {"live", "retired"})

    def _collections(self, view: ViewName, generation: int | None = None) -> dict[str, tuple[int, str]]:
        """Collections of the view (of one generation if given): name -> (generation, suffix)."""
        out = {}
        for c in self._qd().get_collections().collections:
            parsed = generation_of(self.prefix, view, c.name)
            if parsed and generation in (None, parsed[0]):
                out[c.name] = parsed
        return out

    # -- writes --------------------------------------------------------------------------
    def _record(self, view: ViewName, generation: int, *, only_existing: bool = False, **fields) -> None:
        pid = point_uuid("generation", view, str(generation))
        old = self._qd().retrieve(self.collection, [pid])
        if only_existing and not old:
            return
        payload = {"view": view, "generation": generation, "created_at": time.time(), **(old[0].payload if old else {}), **fields}
        upsert(self._qd(), self.collection, [models.PointStruct(id=pid, vector={}, payload=payload)])

    def model(self, view: ViewName, generation: int) -> str | None:
        return next((r.get("model") for r in self._records(view) if r["generation"] == generation), None)

    def new_generation(self, view: ViewName, model: str | None = None) -> int:
        with translated(self.location, f"reserving a generation of view {view}"):
            client = self._qd()
            used = [r["generation"] for r in self._records(view)] + [g for g, _ in self._collections(view).values()]
            n = max(used, default=0) + 1
            while True:
                name = generation_name(self.prefix, view, n)
                try:
                    if not client.collection_exists(name):
                        client.create_collection(name, vectors_config={})
                        break
                except Exception:
                    if not client.collection_exists(name):  # a real failure, not a lost race
                        raise
                n += 1
            self._record(view, n, state="building", model=model)
        return n

    def activate(self, view: ViewName, generation: int) -> None:
        with translated(self.location, f"activating generation {generation} of view {view}"):
            client = self._qd()
            targets = {suffix: name for name, (_, suffix) in self._collections(view, generation).items()}
            if "" not in targets:
                raise StoreError(f"generation {generation} of view {view} has no anchor collection (never reserved, or dropped); "
                                 "reserve a new one with new_generation (memstream replay)")
            aliases = self._aliases()
            ours = {name for name in self._collections(view)}
            stale = [a for a, c in aliases.items() if c in ours and a not in {alias_name(self.prefix, view, s) for s in targets}]
            ops: list = [models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=a)) for a in stale]
            for suffix, name in sorted(targets.items()):
                a = alias_name(self.prefix, view, suffix)
                ops.append(models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=a)))
                ops.append(models.CreateAliasOperation(create_alias=models.CreateAlias(collection_name=name, alias_name=a)))
            previous = aliases.get(alias_name(self.prefix, view, ""))
            client.update_collection_aliases(change_aliases_operations=ops)  # atomic: the switch readers see
            before = {r["generation"] for r in self._records(view) if r["state"] == "live"}
            if previous is not None and generation_of(self.prefix, view, previous):
                before.add(generation_of(self.prefix, view, previous)[0])
            for g in sorted(before - {generation}):
                self._record(view, g, state="retired")
            self._record(view, generation, state="live", activated_at=time.time())

    def drop(self, view: ViewName, generation: int) -> None:
        """Delete a non-live generation's collections; its number stays used."""
        if generation == self.current(view):
            return
        with translated(self.location, f"dropping generation {generation} of view {view}"):
            for name in self._collections(view, generation):
                self._qd().delete_collection(name)
            self._record(view, generation, state="dropped", only_existing=True)
