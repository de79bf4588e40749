"""A Mem0-compatible surface: `Memory` and `AsyncMemory` with the method names, arguments and
result shapes of the `mem0ai` 2.2.1 release (a test compares the signatures with its source), on
memstream's model. Switching an agent over is changing its import:

    from memstream_client.compat.mem0 import Memory      # was: from mem0 import Memory

What maps to what (memstream keeps the raw turns and calls no LLM to extract "memories"):

- a memory is a turn; its `id` is the turn's event id; `memory` is the turn's text;
- `user_id` is the conversation, `run_id` the session, `agent_id` the agent that spoke;
- `add(messages, …)` publishes each non-system message as a turn (`infer` and `prompt` change
  nothing: nothing is extracted or rewritten) and waits until it is searchable, as Mem0's `add`
  returns once stored;
- `search` is memstream's Zero-Mem retrieval over the boundary the filters name; `score` is
  derived from the rank (1.0 for the first result, down to 0.5 for the last), not a similarity;
- `update(id, text)` publishes a correcting turn that supersedes the latest version (searches
  return the correction under the original id; `history` keeps every version);
- `delete` and `delete_all` forget (the turns are erased from the log and every view — their
  history with them), `reset` forgets the whole tenant (an admin key naming the tenant).

The client is configured with `config={"url": …, "api_key": …, "tenant_id": …}` or, as Mem0's
`Memory()` with no argument, from MEMSTREAM_URL and MEMSTREAM_API_KEY.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime, timezone
from typing import Any, Dict, Optional

from memstream_client.client import AsyncClient, Client
from memstream_client.errors import MemstreamError, NotFound
from memstream_client.models import SearchResult, StoredTurn, Turn

_UNSET = object()
_IDS = ("user_id", "agent_id", "run_id")
_ROLES = {"user": "user", "assistant": "assistant", "tool": "tool", "agent": "agent"}
SEP = "~"  # a correction's event id is `<memory id>~<random>`: it maps back to its memory


class ValidationError(MemstreamError, ValueError):
    """Mem0's `mem0.exceptions.ValidationError` for `add` without any of user_id/agent_id/run_id."""


# -- mapping (pure) -----------------------------------------------------------------------------
def _config(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if isinstance(config, dict):
        return dict(config)
    return {k: getattr(config, k) for k in ("url", "api_key", "tenant_id", "wait_seconds", "strategy") if hasattr(config, k)}


def memory_id(event_id: str) -> str:
    return event_id.split(SEP, 1)[0]


def _checked_id(name: str, value: Any) -> str:
    value = str(value).strip()
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"{name} must be a non-empty string without whitespace")
    return value


def _conversation(user_id: str | None, agent_id: str | None, run_id: str | None) -> str:
    return user_id or (f"run-{run_id}" if run_id else f"agent-{agent_id}")


def _messages(messages: Any) -> list[dict[str, Any]]:
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    if isinstance(messages, dict):
        return [messages]
    if isinstance(messages, list):
        return messages
    raise ValidationError("messages must be a str, a dict or a list of dicts with 'role' and 'content'")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # parts: [{"type": "text", "text": …}, …]
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    return str(content)


def _metadata(metadata: dict | None) -> dict[str, Any]:
    out = {}
    for k, v in (metadata or {}).items():
        if k in (*_IDS, "actor_id"):
            continue  # identity keys are arguments, as in Mem0
        out[str(k)] = v if v is None or isinstance(v, (str, int, float, bool)) else str(v)
    return out


def _when(timestamp: Any) -> datetime | None:
    if timestamp is None:
        return None
    if isinstance(timestamp, (int, float)):
        return datetime.fromtimestamp(timestamp, timezone.utc)
    if isinstance(timestamp, datetime):
        return timestamp if timestamp.tzinfo else timestamp.replace(tzinfo=timezone.utc)
    return datetime.fromisoformat(str(timestamp).replace("Z", "+00:00"))


def _turns(messages: Any, user_id, agent_id, run_id, metadata, timestamp) -> list[Turn]:
    conversation, when = _conversation(user_id, agent_id, run_id), _when(timestamp)
    turns = []
    for i, m in enumerate(_messages(messages)):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValidationError("every message needs 'role' and 'content'")
        if m["role"] == "system":
            continue  # instructions to a model, not something said
        role = _ROLES.get(m["role"], "user")
        speaker = str(m.get("name") or m["role"])
        turns.append(Turn(conversation_id=conversation, session_id=run_id or "default", speaker=speaker, role=role, agent_id=agent_id,
                          text=_text(m["content"]), metadata=_metadata(metadata), turn_index=i,
                          **({"occurred_at": when} if when else {})))
    return turns


def _filters(filters: dict | None, kwargs: dict, where: str) -> dict[str, str]:
    top = sorted(set(kwargs) & set(_IDS))
    if top:
        raise ValueError(f"Top-level entity parameters {set(top)} are not supported in {where}(). "
                         f"Use filters={{'{top[0]}': '...'}} instead.")
    filters = dict(filters or {})
    ids = {k: _checked_id(k, filters.pop(k)) for k in _IDS if filters.get(k) is not None}
    if not ids:
        raise ValueError("filters must contain at least one of: user_id, agent_id, run_id.")
    if filters:
        raise ValueError(f"memstream filters by user_id, agent_id and run_id only; not by {sorted(filters)}")
    return ids


def _boundary(ids: dict[str, str]) -> dict[str, Any]:
    return {"conversation_id": ids.get("user_id"), "session_id": ids.get("run_id"), "agent_id": ids.get("agent_id")}


def _hash(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def _item(mid: str, text: str, created: datetime, updated: datetime, conversation: str, session: str, agent: str | None,
          role: str | None, actor: str | None, metadata: dict | None, score: float | None = None, with_score: bool = True) -> dict[str, Any]:
    item: dict[str, Any] = {"id": mid, "memory": text, "hash": _hash(text), "metadata": metadata or None,
                            "created_at": created.isoformat(), "updated_at": updated.isoformat()}
    if with_score:
        item["score"] = score
    if not conversation.startswith(("run-", "agent-")):
        item["user_id"] = conversation
    if session != "default":
        item["run_id"] = session
    if agent:
        item["agent_id"] = agent
    if actor:
        item["actor_id"] = actor
    if role:
        item["role"] = role
    return item


def _search_items(result: SearchResult, ids: dict[str, str], top_k: int, threshold: float) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for e in result.evidence:
        for t in e.turns:
            mid = memory_id(t.event_id)
            if mid not in seen:
                seen[mid] = _item(mid, t.text, t.occurred_at, t.occurred_at, e.conversation_id, t.session_id, ids.get("agent_id"), None,
                                  t.speaker, None)
    items = list(seen.values())[:top_k]
    for i, item in enumerate(items):
        item["score"] = round(1.0 - 0.5 * i / max(1, len(items) - 1), 6) if len(items) > 1 else 1.0
    return [i for i in items if i["score"] >= threshold]


def _stored_item(root: StoredTurn, latest: StoredTurn, with_score: bool) -> dict[str, Any]:
    return _item(root.event_id, latest.text, root.occurred_at, latest.occurred_at, root.conversation_id, root.session_id, root.agent_id,
                 root.role, root.speaker, latest.metadata, None, with_score)


def _history(versions: list[StoredTurn]) -> list[dict[str, Any]]:
    out, previous = [], None
    for v in versions:
        out.append({"id": v.event_id, "memory_id": versions[0].event_id, "old_memory": previous, "new_memory": v.text,
                    "event": "ADD" if previous is None else "UPDATE", "created_at": v.occurred_at.isoformat(),
                    "updated_at": v.occurred_at.isoformat(), "is_deleted": False, "actor_id": v.speaker, "role": v.role})
        previous = v.text
    return out


def _unsupported(expiration_date: Any, memory_type: Any, reference_date: Any = None) -> None:
    if expiration_date not in (None, _UNSET):
        raise NotImplementedError("memstream has no per-memory expiry: a tenant's retention forgets old turns "
                                  "(`memstream tenants set TENANT --retain-days N`)")
    if memory_type is not None:
        raise NotImplementedError("memory_type is not supported: memstream keeps every turn as it was said")
    if reference_date is not None:
        raise NotImplementedError("reference_date is not supported (relative dates resolve against the boundary's latest turn)")


def _options(config: dict) -> tuple[float, str]:
    return float(config.get("wait_seconds", 30.0)), str(config.get("strategy", "zero-mem"))


# -- blocking ---------------------------------------------------------------------------------------
class Memory:
    """Mem0's `Memory`, on a memstream server (module docstring)."""

    def __init__(self, config: Optional[Dict[str, Any]] = None):
        cfg = _config(config)
        self._wait, self._strategy = _options(cfg)
        self.client = Client(cfg.get("url"), cfg.get("api_key"), tenant_id=cfg.get("tenant_id"))

    @classmethod
    def from_config(cls, config_dict: Dict[str, Any]):
        return cls(config_dict)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "Memory":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add(self, messages, *, user_id: Optional[str] = None, agent_id: Optional[str] = None, run_id: Optional[str] = None,
            metadata: Optional[Dict[str, Any]] = None, timestamp: Optional[Any] = None, expiration_date: Optional[Any] = None,
            infer: bool = True, memory_type: Optional[str] = None, prompt: Optional[str] = None):
        if not any((user_id, agent_id, run_id)):
            raise ValidationError("At least one of 'user_id', 'agent_id', or 'run_id' must be provided.")
        _unsupported(expiration_date, memory_type)
        ids = [None if v is None else _checked_id(n, v) for n, v in zip(_IDS, (user_id, agent_id, run_id))]
        turns = _turns(messages, *ids, metadata, timestamp)
        if not turns:
            return {"results": []}
        result = self.client.add(turns)
        if self._wait and result.positions:
            self.client.wait(result.positions, self._wait)
        accepted = {i.event_id for i in result.items if i.status == "accepted"}
        return {"results": [{"id": t.event_id, "memory": t.text, "event": "ADD", "actor_id": t.speaker, "role": t.role}
                            for t in turns if t.event_id in accepted]}

    def get(self, memory_id):
        try:
            root = self.client.get_turn(str(memory_id))
        except NotFound:
            return None
        versions = self.client.turn_history(root.event_id, conversation_id=root.conversation_id).versions
        return _stored_item(root, versions[-1] if versions else root, with_score=True)

    def get_all(self, *, filters: Optional[Dict[str, Any]] = None, top_k: int = 20, show_expired: bool = False, **kwargs):
        ids = _filters(filters, kwargs, "get_all")
        page = self.client.list_turns(**_boundary(ids), limit=max(1, top_k))
        return {"results": [self._current(t) for t in page.turns][:top_k]}

    def _current(self, turn: StoredTurn) -> dict[str, Any]:
        if SEP not in turn.event_id:
            return _stored_item(turn, turn, with_score=False)
        root = self.client.get_turn(memory_id(turn.event_id), conversation_id=turn.conversation_id)
        return _stored_item(root, turn, with_score=False)

    def search(self, query: str, *, top_k: int = 20, filters: Optional[Dict[str, Any]] = None, threshold: float = 0.1, rerank: bool = False,
               explain: bool = False, reference_date: Optional[Any] = None, show_expired: bool = False, **kwargs):
        ids = _filters(filters, kwargs, "search")
        _unsupported(None, None, reference_date)
        if not isinstance(query, str) or not query.strip():
            raise ValueError("query must be a non-empty string")
        result = self.client.search(query.strip(), strategy=self._strategy, max_turns=max(1, top_k), **_boundary(ids))
        return {"results": _search_items(result, ids, top_k, threshold)}

    def update(self, memory_id, text: Optional[str] = None, metadata: Optional[Dict[str, Any]] = None, expiration_date: Any = _UNSET,
               data: Optional[str] = None):
        text = text if text is not None else data
        if text is None and metadata is None:
            raise ValueError("update needs text (or metadata)")
        _unsupported(expiration_date, None)
        try:
            versions = self.client.turn_history(str(memory_id)).versions
        except NotFound:
            raise ValueError(f"Memory with id {memory_id} not found") from None
        latest = versions[-1]
        turn = Turn(conversation_id=latest.conversation_id, session_id=latest.session_id, speaker=latest.speaker, role=latest.role,
                    agent_id=latest.agent_id, text=latest.text if text is None else text,
                    metadata=_metadata(metadata) if metadata is not None else latest.metadata,
                    event_id=f"{versions[0].event_id}{SEP}{uuid.uuid4().hex[:12]}", supersedes=latest.event_id)
        result = self.client.add([turn])
        if self._wait and result.positions:
            self.client.wait(result.positions, self._wait)
        return {"message": "Memory updated successfully!"}

    def delete(self, memory_id):
        try:
            versions = self.client.turn_history(str(memory_id)).versions
        except NotFound:
            raise ValueError(f"Memory with id {memory_id} not found") from None
        positions = [self.client.forget(conversation_id=v.conversation_id, event_id=v.event_id).positions for v in versions]
        self._settle(positions)
        return {"message": "Memory deleted successfully!"}

    def delete_all(self, user_id: Optional[str] = None, agent_id: Optional[str] = None, run_id: Optional[str] = None):
        if not any((user_id, agent_id, run_id)):
            raise ValueError("At least one filter is required to delete all memories. If you want to delete all memories, use the `reset()` method.")
        if user_id and not agent_id:
            positions = [self.client.forget(conversation_id=user_id, session_id=run_id).positions]
        elif agent_id and not user_id and not run_id:
            positions = [self.client.forget(agent_id=agent_id).positions]
        else:  # a narrower mix: each matching turn
            positions = [self.client.forget(conversation_id=t.conversation_id, event_id=t.event_id).positions
                         for t in list(self.client.iter_turns(**_boundary({"user_id": user_id, "agent_id": agent_id, "run_id": run_id}),
                                                               include_superseded=True))]
        self._settle(positions)
        return {"message": "Memories deleted successfully!"}

    def history(self, memory_id):
        try:
            return _history(self.client.turn_history(str(memory_id)).versions)
        except NotFound:
            return []

    def reset(self):
        self._settle([self.client.forget().positions])  # the whole tenant: an admin key naming it (config tenant_id)

    def _settle(self, positions: list) -> None:
        from memstream_client._http import merge_positions

        merged = merge_positions(*positions)
        if self._wait and merged:
            self.client.wait(merged, self._wait)


# -- asyncio ----------------------------------------------------------------------------------------
class AsyncMemory:
    """Mem0's `AsyncMemory`, on a memstream server (module docstring)."""

    def __init__(self, config: Optional[Dict[str, Any]] = None):
        cfg = _config(config)
        self._wait, self._strategy = _options(cfg)
        self.client = AsyncClient(cfg.get("url"), cfg.get("api_key"), tenant_id=cfg.get("tenant_id"))

    @classmethod
    def from_config(cls, config_dict: Dict[str, Any]):
        return cls(config_dict)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def __aenter__(self) -> "AsyncMemory":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def add(self, messages, *, user_id: Optional[str] = None, agent_id: Optional[str] = None, run_id: Optional[str] = None,
                  metadata: Optional[Dict[str, Any]] = None, timestamp: Optional[Any] = None, expiration_date: Optional[Any] = None,
                  infer: bool = True, memory_type: Optional[str] = None, prompt: Optional[str] = None, llm=None):
        if not any((user_id, agent_id, run_id)):
            raise ValidationError("At least one of 'user_id', 'agent_id', or 'run_id' must be provided.")
        _unsupported(expiration_date, memory_type)
        ids = [None if v is None else _checked_id(n, v) for n, v in zip(_IDS, (user_id, agent_id, run_id))]
        turns = _turns(messages, *ids, metadata, timestamp)
        if not turns:
            return {"results": []}
        result = await self.client.add(turns)
        if self._wait and result.positions:
            await self.client.wait(result.positions, self._wait)
        accepted = {i.event_id for i in result.items if i.status == "accepted"}
        return {"results": [{"id": t.event_id, "memory": t.text, "event": "ADD", "actor_id": t.speaker, "role": t.role}
                            for t in turns if t.event_id in accepted]}

    async def get(self, memory_id):
        try:
            root = await self.client.get_turn(str(memory_id))
        except NotFound:
            return None
        versions = (await self.client.turn_history(root.event_id, conversation_id=root.conversation_id)).versions
        return _stored_item(root, versions[-1] if versions else root, with_score=True)

    async def get_all(self, *, filters: Optional[Dict[str, Any]] = None, top_k: int = 20, show_expired: bool = False, **kwargs):
        ids = _filters(filters, kwargs, "get_all")
        page = await self.client.list_turns(**_boundary(ids), limit=max(1, top_k))
        out = []
        for t in page.turns[:top_k]:
            if SEP in t.event_id:
                root = await self.client.get_turn(memory_id(t.event_id), conversation_id=t.conversation_id)
                out.append(_stored_item(root, t, with_score=False))
            else:
                out.append(_stored_item(t, t, with_score=False))
        return {"results": out}

    async def search(self, query: str, *, top_k: int = 20, filters: Optional[Dict[str, Any]] = None, threshold: float = 0.1,
                     rerank: bool = False, explain: bool = False, reference_date: Optional[Any] = None, show_expired: bool = False, **kwargs):
        ids = _filters(filters, kwargs, "search")
        _unsupported(None, None, reference_date)
        if not isinstance(query, str) or not query.strip():
            raise ValueError("query must be a non-empty string")
        result = await self.client.search(query.strip(), strategy=self._strategy, max_turns=max(1, top_k), **_boundary(ids))
        return {"results": _search_items(result, ids, top_k, threshold)}

    async def update(self, memory_id, text: Optional[str] = None, metadata: Optional[Dict[str, Any]] = None, expiration_date: Any = _UNSET,
                     data: Optional[str] = None):
        text = text if text is not None else data
        if text is None and metadata is None:
            raise ValueError("update needs text (or metadata)")
        _unsupported(expiration_date, None)
        try:
            versions = (await self.client.turn_history(str(memory_id))).versions
        except NotFound:
            raise ValueError(f"Memory with id {memory_id} not found") from None
        latest = versions[-1]
        turn = Turn(conversation_id=latest.conversation_id, session_id=latest.session_id, speaker=latest.speaker, role=latest.role,
                    agent_id=latest.agent_id, text=latest.text if text is None else text,
                    metadata=_metadata(metadata) if metadata is not None else latest.metadata,
                    event_id=f"{versions[0].event_id}{SEP}{uuid.uuid4().hex[:12]}", supersedes=latest.event_id)
        result = await self.client.add([turn])
        if self._wait and result.positions:
            await self.client.wait(result.positions, self._wait)
        return {"message": "Memory updated successfully!"}

    async def delete(self, memory_id):
        try:
            versions = (await self.client.turn_history(str(memory_id))).versions
        except NotFound:
            raise ValueError(f"Memory with id {memory_id} not found") from None
        positions = [(await self.client.forget(conversation_id=v.conversation_id, event_id=v.event_id)).positions for v in versions]
        await self._settle(positions)
        return {"message": "Memory deleted successfully!"}

    async def delete_all(self, user_id=None, agent_id=None, run_id=None):
        if not any((user_id, agent_id, run_id)):
            raise ValueError("At least one filter is required to delete all memories. If you want to delete all memories, use the `reset()` method.")
        if user_id and not agent_id:
            positions = [(await self.client.forget(conversation_id=user_id, session_id=run_id)).positions]
        elif agent_id and not user_id and not run_id:
            positions = [(await self.client.forget(agent_id=agent_id)).positions]
        else:
            turns = [t async for t in self.client.iter_turns(**_boundary({"user_id": user_id, "agent_id": agent_id, "run_id": run_id}),
                                                             include_superseded=True)]
            positions = [(await self.client.forget(conversation_id=t.conversation_id, event_id=t.event_id)).positions for t in turns]
        await self._settle(positions)
        return {"message": "Memories deleted successfully!"}

    async def history(self, memory_id):
        try:
            return _history((await self.client.turn_history(str(memory_id))).versions)
        except NotFound:
            return []

    async def reset(self):
        await self._settle([(await self.client.forget()).positions])

    async def _settle(self, positions: list) -> None:
        from memstream_client._http import merge_positions

        merged = merge_positions(*positions)
        if self._wait and merged:
            await self.client.wait(merged, self._wait)


__all__ = ["AsyncMemory", "Memory", "ValidationError"]
