"""Data key store port: one AES-256 data key per turn, so that forgetting can destroy it.

Every TurnRecorded memstream appends to the log is sealed (schemas/sealing.py) with the data key
of its event, `key_id(tenant, conversation, event_id)`: a duplicate publish of an event reuses
its key, and destroying that one key shreds every copy of the event in the log, in the dead
letters and in the stores that keep only sealed text (schemas/sealing.py's TextSealer). The
store is the one place where key bytes live, so it must be able to erase them.

Behaviour every adapter guarantees (tests/contracts/test_keystore_contract.py):

- **Put is idempotent and durable.** `put(rows)` returns once the keys are durable and visible
  to every reader (a worker reading the sealed record next must find its key); a key id that
  exists keeps its first secret (so copies of an event decrypt with one key), and a destroyed
  key id stays destroyed — `put` never resurrects it (the tombstone wins).
- **Destroy erases the bytes.** `destroy(key_ids, forget_id)` removes the secrets and leaves a
  tombstone per key (ids, when, which forget; never the secret). Embedded: SQLite with
  secure_delete and a truncated WAL, so the bytes are gone from every file when it returns;
  servers: as soon as the engine allows (`erasure_deferred_seconds` says how long at most).
- **Tombstones are forever.** `destroyed(key_ids)` answers which keys were destroyed, whatever
  happened since (replay, backup and restore of the views): they are the "refused forever" list
  the publisher and the projections consult.
- **Tenants.** Every row carries its tenant; reads take key ids, which hash the tenant.
- **Positions.** The eraser (streams/eraser.py) keeps its position per partition here, written
  with the destroys it makes, like a view.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Iterable, Protocol

from schemas.ports.views import Positions
from schemas.units import _digest


def key_id(tenant_id: str, conversation_id: str, event_id: str) -> str:
    """The data key of an event: every copy of the event shares it."""
    return "k_" + _digest("datakey", tenant_id, conversation_id, event_id)


@dataclass(frozen=True)
class DataKey:
    key_id: str
    tenant_id: str
    conversation_id: str
    event_id: str
    secret: bytes = field(repr=False)  # 32 random bytes


@dataclass(frozen=True)
class EventRef:
    """An event whose key is to be destroyed (known to the store or not: an event written before
    sealing existed has no key, but still gets its tombstone)."""

    tenant_id: str
    conversation_id: str
    event_id: str

    @property
    def key_id(self) -> str:
        return key_id(self.tenant_id, self.conversation_id, self.event_id)


@dataclass(frozen=True)
class Tombstone:
    key_id: str
    tenant_id: str
    conversation_id: str
    event_id: str
    destroyed_at: datetime
    forget_id: str


class KeyStore(Protocol):
    backend: str
    erasure_deferred_seconds: float  # 0: destroyed bytes are gone from disk when destroy returns

    def start(self) -> None: ...

    def close(self) -> None: ...

    def put(self, keys: Iterable[DataKey]) -> dict[str, DataKey]:
        """Store new keys; returns, per key id asked for, the key now held (the first one put),
        without destroyed ones."""
        ...

    def get(self, key_ids: Iterable[str]) -> dict[str, DataKey]:
        """The live keys among `key_ids` (destroyed and unknown ones are absent)."""
        ...

    def destroyed(self, key_ids: Iterable[str]) -> dict[str, Tombstone]:
        """The tombstones among `key_ids`."""
        ...

    def destroy(self, events: Iterable[EventRef], forget_id: str, *, positions: Positions | None = None) -> list[Tombstone]:
        """Erase these events' keys and leave a tombstone for each (also for an event the store
        held no key for); record the eraser's positions in the same write. Returns the new
        tombstones (events already destroyed are not repeated)."""
        ...

    def positions(self) -> Positions: ...

    def write_positions(self, positions: Positions) -> None: ...

    def tombstones(self, tenant_id: str, *, after: str | None = None, limit: int = 1000) -> list[Tombstone]:
        """A tenant's tombstones in key-id order, from after `after` (a cursor)."""
        ...

    def canonical_dump(self) -> dict:
        """Ids and tombstones (never secrets), for tests comparing stores."""
        ...
