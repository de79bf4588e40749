"""Shared plumbing of the Neo4j adapters (graph view, view catalog): the driver, error
translation, idempotent schema creation and the turn-row mapping.

Not an adapter itself (like infra/sqlite_base.py). The official `neo4j` driver connects lazily,
so building a driver does no I/O; the first query opens the connection pool.

Errors: ServiceUnavailable / SessionExpired (server down, leader lost, connection dropped) and
Neo4j's own transient errors (deadlock, lock timeout) become `TransientError` (the runner retries
with back-off); every other driver or server error becomes `StoreError` with what the operator
should check.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Iterator

import neo4j
from neo4j import exceptions as neo_exc

from schemas.errors import CredentialsRefused, MemstreamError, StoreError, TransientError
from schemas.ports.views import TurnRow

log = logging.getLogger(__name__)

# Node labels holding one generation of a view's data (every such node carries `gen`), and the
# bookkeeping labels (which also carry `view`). A shared naming convention, so that the catalog
# can reclaim a generation's storage without importing the view's adapter.
VIEW_LABELS: dict[str, tuple[str, ...]] = {"graph": ("Sentence", "Context", "Entity")}
BOOKKEEPING_LABELS = ("MemstreamPosition", "MemstreamVersion")

TURN_FIELDS = ("turn_id", "tenant_id", "conversation_id", "session_id", "event_id", "agent_id", "speaker", "role",
               "turn_index", "occurred_at", "text", "source_ref", "partition", "offset", "content_hash")
# What a Neo4j turn ledger keeps: no text, speaker or source_ref. Neo4j leaves deleted records'
# bytes in its store files and transaction logs, so whatever it is given stays on disk after a
# forget; the graph projection never reads those fields back (schemas/ports/graph.py).
KEPT_TURN_FIELDS = tuple(f for f in TURN_FIELDS if f not in ("text", "speaker", "source_ref"))


def connect(uri: str, auth: tuple[str, str] | None = None, **config) -> neo4j.Driver:
    """A driver for `neo4j://` or `bolt://` URIs (auth None: a server with auth disabled).
    No I/O happens here. The server's UNRECOGNIZED notifications are turned off: a fresh
    database has no `next_offset` property yet, and every positions read would log a warning."""
    config.setdefault("notifications_disabled_classifications", ["UNRECOGNIZED"])
    return neo4j.GraphDatabase.driver(uri, auth=auth, **config)


@contextmanager
def translated(uri: str, what: str) -> Iterator[None]:
    """Driver errors -> TransientError (retry with back-off) or StoreError (operator action)."""
    try:
        yield
    except MemstreamError:
        raise
    except (neo_exc.ServiceUnavailable, neo_exc.SessionExpired) as exc:
        raise TransientError(f"Neo4j at {uri} is unavailable while {what} ({type(exc).__name__}: {exc}); "
                             "check that the server is up and reachable; the operation is retried") from exc
    except neo_exc.AuthError as exc:
        raise CredentialsRefused(f"Neo4j at {uri} refused the credentials while {what} ({exc.code}); check the user in "
                         "MEMSTREAM_VIEWS_GRAPH_URL (neo4j://USER@host:port) and MEMSTREAM_VIEWS_NEO4J_PASSWORD") from None
    except neo_exc.TransientError as exc:
        raise TransientError(f"Neo4j at {uri} reported a transient failure while {what} ({exc.code}: {exc.message}); "
                             "the operation is retried") from exc
    except neo_exc.Neo4jError as exc:
        if (exc.code or "").startswith("Neo.ClientError.Security."):  # e.g. AuthenticationRateLimit after wrong passwords
            raise CredentialsRefused(f"Neo4j at {uri} refused the credentials while {what} ({exc.code}); check the user in "
                                     "MEMSTREAM_VIEWS_GRAPH_URL (neo4j://USER@host:port) and MEMSTREAM_VIEWS_NEO4J_PASSWORD") from None
        raise StoreError(f"Neo4j at {uri} refused {what} ({exc.code}: {exc.message}); check the server's debug.log, "
                         "that the Graph Data Science plugin is installed and gds.* procedures are allowed "
                         "(dbms.security.procedures.unrestricted=gds.*)") from exc
    except neo_exc.DriverError as exc:
        raise StoreError(f"the Neo4j driver failed while {what} against {uri} ({type(exc).__name__}: {exc}); "
                         "check the URI (neo4j:// or bolt://), the credentials, and that the store was not closed") from exc


def ensure_schema(session: neo4j.Session, statements: list[str]) -> None:
    """Create constraints/indexes (`IF NOT EXISTS`); a concurrent creator winning the race is fine."""
    for stmt in statements:
        try:
            session.run(stmt).consume()
        except neo_exc.ClientError as exc:
            if "AlreadyExists" not in (exc.code or ""):
                raise
    session.run("CALL db.awaitIndexes(120)").consume()


def projection_prefix(view: str, generation: int) -> str:
    """GDS projections of one view generation are named `<prefix><key>-<version>`."""
    return f"memstream-{view}-g{generation}-"


def drop_generation_data(session: neo4j.Session, view: str, generation: int) -> None:
    """Delete a view generation's nodes (in batches, each its own transaction) and its GDS
    projections. Idempotent."""
    for label in VIEW_LABELS.get(view, ()):
        session.run(f"MATCH (n:{label}) WHERE n.gen = $gen CALL (n) {{ DETACH DELETE n }} IN TRANSACTIONS OF 5000 ROWS",
                    gen=generation).consume()
    for label in BOOKKEEPING_LABELS:
        session.run(f"MATCH (n:{label}) WHERE n.gen = $gen AND n.view = $view CALL (n) {{ DETACH DELETE n }} IN TRANSACTIONS OF 5000 ROWS",
                    gen=generation, view=view).consume()
    if view in VIEW_LABELS:
        session.run("CALL gds.graph.list() YIELD graphName WHERE graphName STARTS WITH $prefix "
                    "CALL gds.graph.drop(graphName, false) YIELD graphName AS dropped RETURN count(dropped)",
                    prefix=projection_prefix(view, generation)).consume()


def utc(t: datetime) -> datetime:
    """Aware datetimes only reach Neo4j (a naive one would become a LocalDateTime, which never
    compares equal or ordered to a DateTime): naive values are taken as UTC."""
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t


def turn_props(t: TurnRow) -> dict:
    """A turn's ledger properties: KEPT_TURN_FIELDS only (never its text or speaker)."""
    props = {f: getattr(t, f) for f in KEPT_TURN_FIELDS}
    props["occurred_at"] = utc(t.occurred_at)
    return props


def props_to_turn(p: dict) -> TurnRow:
    """A ledger turn back; the fields Neo4j does not keep come back empty (text '', speaker '',
    source_ref None)."""
    occurred = p["occurred_at"]
    occurred = occurred.to_native() if hasattr(occurred, "to_native") else occurred
    return TurnRow(**{f: p.get(f) for f in KEPT_TURN_FIELDS if f != "occurred_at"}, text="", speaker="", source_ref=None,
                   occurred_at=occurred.astimezone(timezone.utc))
