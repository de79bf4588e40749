"""View catalog in Neo4j: which generation of each view is live, as a small node set

    (:MemstreamGeneration {view, generation, state, created_at, activated_at, model})
        state: building | live | retired | dropped
    (:MemstreamCatalogLock {view})   one per view, written first in every changing transaction

Every change is one transaction that starts by writing the view's lock node, so Neo4j's write
lock on it serialises concurrent catalogs: reserving never hands out one number twice and
`activate` flips live -> retired and the new generation -> live atomically (a reader sees the
old or the new live generation, never none or two). Dropped generations keep their node, so
numbers are never reused. `drop` also deletes the generation's data (infra/neo4j_base.py names
each view's node labels and projection prefix), so a replay's retired generation is reclaimed.
"""

from __future__ import annotations

import time

from infra.neo4j_base import connect, drop_generation_data, ensure_schema, translated
from schemas.errors import StoreError
from schemas.ports.views import ViewName

_SCHEMA = [
    "CREATE CONSTRAINT memstream_generation_key IF NOT EXISTS FOR (n:MemstreamGeneration) REQUIRE (n.view, n.generation) IS UNIQUE",
    "CREATE CONSTRAINT memstream_catalog_lock_key IF NOT EXISTS FOR (n:MemstreamCatalogLock) REQUIRE n.view IS UNIQUE",
]
_LOCK = "MERGE (l:MemstreamCatalogLock {view: $view}) SET l.touched_at = $now"


class Neo4jViewCatalog:
    def __init__(self, uri: str, *, auth: tuple[str, str] | None = None, database: str | None = None, **driver_config):
        self.uri = uri
        self.database = database
        self._driver = connect(uri, auth, **driver_config)  # lazy: no I/O until the first call
        self._ready = False

    def _session(self):
        if not self._ready:
            with translated(self.uri, "creating the view catalog's constraints"), self._driver.session(database=self.database) as s:
                ensure_schema(s, _SCHEMA)
            self._ready = True
        return self._driver.session(database=self.database)

    def _generations(self, view: ViewName, state: str) -> list[int]:
        with translated(self.uri, f"reading the {view} view's generations"), self._session() as s:
            return [r["g"] for r in s.run("MATCH (n:MemstreamGeneration {view: $view, state: $state}) RETURN n.generation AS g ORDER BY g",
                                          view=view, state=state)]

    def current(self, view: ViewName) -> int | None:
        live = self._generations(view, "live")
        return live[-1] if live else None

    def model(self, view: ViewName, generation: int) -> str | None:
        with translated(self.uri, f"reading generation {generation} of the {view} view"), self._session() as s:
            row = s.run("MATCH (n:MemstreamGeneration {view: $view, generation: $g}) RETURN n.model AS model", view=view, g=generation).single()
        return row["model"] if row else None

    def new_generation(self, view: ViewName, model: str | None = None) -> int:
        with translated(self.uri, f"reserving a generation of the {view} view"), self._session() as s, s.begin_transaction() as tx:
            tx.run(_LOCK, view=view, now=time.time()).consume()
            n = tx.run("OPTIONAL MATCH (n:MemstreamGeneration {view: $view}) RETURN coalesce(max(n.generation), 0) + 1 AS n",
                       view=view).single()["n"]
            tx.run("CREATE (:MemstreamGeneration {view: $view, generation: $n, state: 'building', created_at: $now, model: $model})",
                   view=view, n=n, now=time.time(), model=model).consume()
            tx.commit()
        return n

    def activate(self, view: ViewName, generation: int) -> None:
        with translated(self.uri, f"activating generation {generation} of the {view} view"), self._session() as s, s.begin_transaction() as tx:
            tx.run(_LOCK, view=view, now=time.time()).consume()
            if tx.run("MATCH (n:MemstreamGeneration {view: $view, generation: $g}) RETURN 1", view=view, g=generation).single() is None:
                raise StoreError(f"generation {generation} of the {view} view was never reserved (new_generation); nothing was switched")
            tx.run("MATCH (n:MemstreamGeneration {view: $view, state: 'live'}) WHERE n.generation <> $g SET n.state = 'retired'",
                   view=view, g=generation).consume()
            tx.run("MATCH (n:MemstreamGeneration {view: $view, generation: $g}) SET n.state = 'live', n.activated_at = $now",
                   view=view, g=generation, now=time.time()).consume()
            tx.commit()

    def building(self, view: ViewName) -> list[int]:
        return self._generations(view, "building")

    def retired(self, view: ViewName) -> list[int]:
        return self._generations(view, "retired")

    def drop(self, view: ViewName, generation: int) -> None:
        """Mark a generation dropped and delete its data (nodes, GDS projections) — never the
        live generation's."""
        with translated(self.uri, f"dropping generation {generation} of the {view} view"), self._session() as s:
            with s.begin_transaction() as tx:
                tx.run(_LOCK, view=view, now=time.time()).consume()
                live = tx.run("MATCH (n:MemstreamGeneration {view: $view, generation: $g, state: 'live'}) RETURN 1",
                              view=view, g=generation).single() is not None
                tx.run("MATCH (n:MemstreamGeneration {view: $view, generation: $g}) WHERE n.state <> 'live' SET n.state = 'dropped'",
                       view=view, g=generation).consume()
                tx.commit()
            if not live:
                drop_generation_data(s, view, generation)

    def close(self) -> None:
        self._driver.close()
