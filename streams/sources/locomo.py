"""LoCoMo conversations -> TurnRecorded events.

Each sample is its own conversation (conversation_id = sample_id); sessions keep their number;
the session's date is every turn's `occurred_at` (LoCoMo gives no time zone: read as UTC);
an image's `blip_caption` becomes an image-caption attachment (indexed with the turn's text);
`dia_id` is kept as the turn's `source_ref`. Event ids are `<sample_id>:<dia_id>`, so
ingesting the same file twice publishes duplicates that the views ignore.

The LLM-generated summaries and observations in the file are not part of the raw record and
are not ingested.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from schemas.errors import BadRequest
from schemas.events import Attachment, TurnRecorded

# The dev split, where the machines keep it (beside the repository; never copied into it).
DEFAULT_PATH = Path(__file__).resolve().parents[3] / "shared/data/locomo/locomo-dev.json"

_SESSION = re.compile(r"^session_(\d+)$")
_DIA = re.compile(r"^D(\d+):(\d+)$")


def parse_session_date(value: str) -> datetime:
    """'1:56 pm on 8 May, 2023' -> 2023-05-08T13:56:00Z."""
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y"):
        try:
            return datetime.strptime(value.strip(), fmt).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    raise BadRequest(f"unrecognised LoCoMo session date {value!r}")


def load(path: str | Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadRequest(f"no such file: {path}") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, list) or not all(isinstance(s, dict) and "conversation" in s for s in data):
        raise BadRequest(f"{path} does not look like LoCoMo (a list of samples with 'conversation')")
    return data


def sessions(sample: dict[str, Any]) -> list[tuple[int, list[dict], datetime]]:
    conv = sample["conversation"]
    out = []
    for key, turns in conv.items():
        m = _SESSION.match(key)
        if m and isinstance(turns, list):
            n = int(m.group(1))
            out.append((n, turns, parse_session_date(conv[f"session_{n}_date_time"])))
    return sorted(out)


def events(samples: list[dict[str, Any]], tenant_id: str, conversations: set[str] | None = None) -> Iterator[TurnRecorded]:
    for sample in samples:
        sample_id = str(sample["sample_id"])
        if conversations is not None and sample_id not in conversations:
            continue
        for n, turns, occurred_at in sessions(sample):
            for position, t in enumerate(turns):
                dia_id = t.get("dia_id", f"D{n}:{position + 1}")
                m = _DIA.match(dia_id)
                attachments = ()
                if t.get("blip_caption"):
                    urls = t.get("img_url") if isinstance(t.get("img_url"), list) else []
                    # Some images are inlined as data: URIs (hundreds of KB): keep links only.
                    uri = next((u for u in urls if isinstance(u, str) and not u.startswith("data:") and len(u) <= 2048), None)
                    attachments = (Attachment(kind="image_caption", text=t["blip_caption"], uri=uri),)
                yield TurnRecorded(
                    event_id=f"{sample_id}:{dia_id}",
                    tenant_id=tenant_id,
                    agent_id=t["speaker"],
                    conversation_id=sample_id,
                    session_id=f"session_{n}",
                    turn_index=int(m.group(2)) if m else position + 1,
                    speaker=t["speaker"],
                    role="user",
                    text=t.get("text", ""),
                    attachments=attachments,
                    occurred_at=occurred_at,
                    source_ref=dia_id,
                )
