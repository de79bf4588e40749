"""Shared vocabulary of the view stores (hierarchy, lexical, dense, graph).

Every view store:

- is bound to one *generation* of its view (replay builds generation N+1 beside N and the
  catalog switches readers atomically, see `ViewCatalog`);
- keeps a **turn ledger**: the turns it has accepted, so a projection can recompute a
  session's windows/episodes/adjacency after a late or out-of-order turn, and so duplicates
  (same event id in a conversation) are recognised and ignored;
- applies each change set **together with the projection's positions** — in one transaction
  where the backend has them, otherwise with deterministic ids and upserts so that re-applying a
  change set after a crash is harmless. The commit order is always: write the view, then the
  positions, then (runner) commit the consumer group. That order *is* the delivery guarantee:
  at-least-once delivery made idempotent by ids, i.e. effectively once.
- is tenant-scoped on every read: a `Boundary` always names the tenant;
- **forgets to the byte**: a forget removes every turn `ForgetScope.covers` from the view's
  reads, and physically from its files — at once where the engine allows it (SQLite with
  secure_delete and a truncated WAL; tantivy by rebuilding its index), deferred with a bound
  where erasure must wait (OpenSearch: `erase_pending`/`erase_due`), and where an engine keeps
  whatever it was once given (Qdrant's write-ahead log, Neo4j's store files) by never giving it
  plaintext at all (sealed with the turn's data key, or not stored).
"""

from __future__ import annotations

import functools
import hashlib
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Iterator, Literal, Protocol, TypeVar

from schemas.events import ForgetScope

# partition -> next offset to read. Positions always refer to the source-of-record topic.
Positions = dict[int, int]

ViewName = Literal["hierarchy", "graph", "lexical", "dense"]
VIEW_NAMES: tuple[ViewName, ...] = ("hierarchy", "graph", "lexical", "dense")
# Views whose generations hold an encoder's vectors (dense: units; graph: entities): a generation
# is built with, and its questions are encoded by, one model (ViewCatalog.model).
ENCODED_VIEWS: tuple[ViewName, ...] = ("dense", "graph")


@dataclass(frozen=True)
class TurnRow:
    """A turn as a view remembers it (enough to rebuild its session's units)."""

    turn_id: str
    tenant_id: str
    conversation_id: str
    session_id: str
    event_id: str
    agent_id: str
    speaker: str
    role: str
    turn_index: int
    occurred_at: datetime
    text: str  # utterance + attachments (TurnRecorded.full_text)
    source_ref: str | None
    partition: int
    offset: int
    content_hash: str
    supersedes: str | None = None  # the event id this turn corrects (TurnRecorded.supersedes)

    @property
    def session_key(self) -> tuple[str, str, str]:
        return (self.tenant_id, self.conversation_id, self.session_id)


def content_hash(*parts: object) -> str:
    h = hashlib.blake2b(digest_size=12)
    for p in parts:
        h.update(repr(p).encode("utf-8"))
    return h.hexdigest()


_READ_SCOPE: ContextVar[dict | None] = ContextVar("memstream_read_scope", default=None)
_V = TypeVar("_V")


@contextmanager
def read_scope() -> Iterator[None]:
    """One request's reads: inside it, a store's version reads (`once_per_request`) run once
    per store and arguments, and every later read of the request sees that version. A query's
    stages then agree on one version per conversation (their caches stay consistent if a write
    lands mid-query), and a Zero-Mem query pays 3 version reads instead of 15 (on a server, as
    many round trips)."""
    token = _READ_SCOPE.set({})
    try:
        yield
    finally:
        _READ_SCOPE.reset(token)


def once_per_request(read: Callable[..., _V]) -> Callable[..., _V]:
    """Decorator for a store's version read (positional, hashable arguments): inside a
    `read_scope` it runs once per store and arguments; outside one, every time."""

    @functools.wraps(read)
    def pinned(self, *args):
        scope = _READ_SCOPE.get()
        if scope is None:
            return read(self, *args)
        key = (id(self), read.__name__, *args)  # stores outlive the request (LiveViews retires, never drops, them mid-query)
        if key not in scope:
            scope[key] = read(self, *args)
        return scope[key]

    return pinned


@dataclass(frozen=True)
class Boundary:
    """The admissible scope of a read. The tenant is mandatory; everything else narrows it."""

    tenant_id: str
    conversation_ids: tuple[str, ...] | None = None
    session_ids: tuple[str, ...] | None = None
    agent_ids: tuple[str, ...] | None = None
    since: datetime | None = None
    until: datetime | None = None

    @property
    def conversation_id(self) -> str | None:
        """The single conversation this boundary is limited to, if it is."""
        if self.conversation_ids and len(self.conversation_ids) == 1:
            return self.conversation_ids[0]
        return None


@dataclass(frozen=True)
class Forget:
    tenant_id: str
    scope: ForgetScope


@dataclass(frozen=True)
class Hit:
    unit_id: str
    score: float


@dataclass
class ChangeSet:
    """What one projection batch changes in its view. Stores apply it in this order: forgets,
    turn deletions, the view-specific deletes and upserts, then the turn ledger puts. Where the
    change set is not one transaction (the servers), the ledger comes last on purpose, both ways:
    the view's documents of each forget go first, the ledger's removals (forgets, turn deletions)
    and puts after the view-specific deletes and upserts. A turn in the ledger means its view data
    is written, so a crash before the put re-delivers the turn as new; and a forgotten turn leaves
    the ledger only once the sessions it was in are rewritten, so a crash before that re-delivers
    a forget that still finds its turns and recomputes those sessions (removing the ledger's turns
    first left their old windows and episodes in the view for good)."""

    forgets: list[Forget] = field(default_factory=list)
    delete_turns: list[str] = field(default_factory=list)  # turn ids
    put_turns: list[TurnRow] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.forgets or self.delete_turns or self.put_turns)


class TurnLedger(Protocol):
    def find_turns(self, tenant_id: str, conversation_id: str, event_ids: list[str]) -> dict[str, TurnRow]:
        """Turns already accepted, by event id (for deduplication)."""
        ...

    def session_turns(self, tenant_id: str, conversation_id: str, session_id: str) -> list[TurnRow]:
        """Accepted turns of one session, in canonical order (schemas.ordering)."""
        ...

    def turns_in_scope(self, forget: Forget) -> list[TurnRow]:
        """Accepted turns a forget request covers."""
        ...


class ViewStore(TurnLedger, Protocol):
    backend: str  # e.g. "sqlite", "tantivy", "opensearch": named in search responses
    # True when a read is a round trip to a server: the query service then issues independent
    # reads from several threads at once (services/query/context.py `ahead`), so a remote
    # store's reads must be safe to call concurrently.
    remote: bool
    view: ViewName
    generation: int

    def positions(self) -> Positions:
        """Positions recorded with the last applied change set ({} for a fresh generation)."""
        ...

    def conversation_version(self, tenant_id: str, conversation_id: str | None) -> int:
        """A number that changes whenever the conversation's data in this view changes
        (None: any conversation of the tenant). Query-side caches key on it."""
        ...

    def known_tenant(self, tenant_id: str) -> bool:
        """Whether the view holds any turn of the tenant."""
        ...

    def canonical_dump(self) -> dict:
        """A deterministic, JSON-able dump of the whole view, for replay-equality tests."""
        ...

    # Physical erasure. `erasure_deferred_seconds` is the store's bound (0: a forget's bytes are
    # gone from its files when `apply` returns). A store that must defer keeps what is pending
    # durably; the runner calls `erase_due()` when `erase_pending()` says it is due, e.g. when idle.
    erasure_deferred_seconds: float

    def erase_pending(self) -> float | None:
        """None when every forget applied so far is erased from the store's files; else the
        seconds until `erase_due()` can make progress (0: now). Also what status shows."""
        ...

    def erase_due(self) -> float | None:
        """Erase what is due (nothing where erasure happens in `apply`); returns
        `erase_pending()` afterwards."""
        ...

    def close(self) -> None: ...


class ViewCatalog(Protocol):
    """Which generation of each view is live. Switching is atomic for readers."""

    def current(self, view: ViewName) -> int | None: ...

    def new_generation(self, view: ViewName, model: str | None = None) -> int:
        """Reserve a fresh, empty generation (not yet live). `model` names the encoder the
        generation is built with (dense and graph views): its vectors are that model's, and its
        questions must be encoded by it too."""
        ...

    def model(self, view: ViewName, generation: int) -> str | None:
        """The encoder `generation` was reserved with; None if none was recorded (a generation
        from before models were recorded, or a view that uses none)."""
        ...

    def activate(self, view: ViewName, generation: int) -> None:
        """Make `generation` live; the previous live generation is retired."""
        ...

    def building(self, view: ViewName) -> list[int]:
        """Generations reserved by a replay that has not switched yet."""
        ...

    def retired(self, view: ViewName) -> list[int]:
        """Generations no longer live whose storage may be reclaimed."""
        ...

    def drop(self, view: ViewName, generation: int) -> None: ...
