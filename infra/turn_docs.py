"""Turn rows as JSON documents, for the server-backed ledgers (OpenSearch, Qdrant payloads),
and the dump shape every ledger shares (infra/sqlite_base.py), so canonical dumps compare
across backends."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from schemas.ports.views import TurnRow

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def micros(t: datetime) -> int:
    """Exact integer microseconds since the epoch (float timestamps can lose the last digit)."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return (t - _EPOCH) // timedelta(microseconds=1)


def turn_doc(t: TurnRow) -> dict:
    return {
        "type": "turn", "turn_id": t.turn_id, "tenant_id": t.tenant_id, "conversation_id": t.conversation_id,
        "session_id": t.session_id, "event_id": t.event_id, "agent_id": t.agent_id, "speaker": t.speaker, "role": t.role,
        "turn_index": t.turn_index, "occurred_at": t.occurred_at.isoformat(), "occurred_us": micros(t.occurred_at),  # for range filters
        "text": t.text, "source_ref": t.source_ref, "partition": t.partition, "offset": t.offset, "content_hash": t.content_hash,
        "supersedes": t.supersedes,
    }


def doc_turn(d: dict) -> TurnRow:
    return TurnRow(
        turn_id=d["turn_id"], tenant_id=d["tenant_id"], conversation_id=d["conversation_id"], session_id=d["session_id"],
        event_id=d["event_id"], agent_id=d["agent_id"], speaker=d["speaker"], role=d["role"], turn_index=d["turn_index"],
        occurred_at=datetime.fromisoformat(d["occurred_at"]), text=d["text"], source_ref=d["source_ref"],
        partition=d["partition"], offset=d["offset"], content_hash=d["content_hash"], supersedes=d.get("supersedes"),
    )


def ledger_dump(turns: list[TurnRow]) -> list[dict]:
    """The shape of SqliteViewBase.ledger_dump: ids, log positions and the content hash (which
    changes with the text), not the text itself — stores that keep it sealed (Qdrant) or not at
    all (Neo4j) dump the same as the ones that keep it."""
    return [
        {"turn_id": t.turn_id, "tenant": t.tenant_id, "conversation": t.conversation_id, "session": t.session_id,
         "event_id": t.event_id, "partition": t.partition, "offset": t.offset, "hash": t.content_hash}
        for t in sorted(turns, key=lambda t: t.turn_id)
    ]
