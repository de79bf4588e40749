"""Mem0's open-source `Memory` and `AsyncMemory` (mem0ai 2.2.1's method names, parameters and
result shapes; tests/unit/test_mem0_signatures.py compares them with its source). Each method
checks its arguments as mem0ai does and runs one plan of plans.py."""

from __future__ import annotations

from typing import Any, Dict, Optional

from memstream_client.client import AsyncClient, Client
from memstream_client.compat.mem0 import plans
from memstream_client.compat.mem0.errors import ValidationError
from memstream_client.compat.mem0.filters import IDS, parse
from memstream_client.compat.mem0.plans import Config, Plan, check_query, check_threshold, check_top_k, refuse

_UNSET: Any = object()
NO_IDS = "At least one of 'user_id', 'agent_id', or 'run_id' must be provided."


def _settings(config: Any) -> dict[str, Any]:
    """`{"url", "api_key", "tenant_id", "wait_seconds", "strategy"}` from a dict or any object with
    those attributes (a Mem0 MemoryConfig has none: the environment then, as `Memory()`)."""
    if config is None:
        return {}
    if isinstance(config, dict):
        return dict(config)
    names = ("url", "api_key", "tenant_id", "wait_seconds", "strategy")
    return {k: getattr(config, k) for k in names if hasattr(config, k)}


def _config(cfg: dict[str, Any]) -> Config:
    return Config(wait_seconds=float(cfg.get("wait_seconds", 30.0)), strategy=cfg.get("strategy"))


def _no_top_level_ids(kwargs: dict[str, Any], method: str) -> None:
    top = sorted(set(kwargs) & set(IDS))
    if top:
        raise ValidationError(f"Top-level entity parameters {set(top)} are not supported in {method}(). "
                              f"Use filters={{'{top[0]}': '...'}} instead.")


# -- the operations as plans, checked as mem0ai checks them -------------------------------------
def _add(config: Config, messages, user_id, agent_id, run_id, metadata, timestamp, expiration_date,
         memory_type) -> Plan[dict]:
    ids = plans.entity_ids(user_id, agent_id, run_id, required=NO_IDS)
    refuse(expiration_date=expiration_date, memory_type=memory_type)
    return (yield from plans.add(config, messages, ids, metadata, timestamp))


def _get_all(filters, top_k, kwargs) -> Plan[dict]:
    _no_top_level_ids(kwargs, "get_all")
    top_k = kwargs.pop("limit", top_k)  # Mem0 1.x's name for top_k
    found, _ = yield from plans.get_all(parse(filters), check_top_k(top_k), platform=False)
    return {"results": found}


def _search(config: Config, query, top_k, filters, threshold, explain, reference_date, kwargs) -> Plan[dict]:
    if reference_date is not None:
        raise ValidationError("reference_date is not supported: relative dates resolve against the boundary's "
                              "latest turn (mem0ai's open-source Memory refuses it too)")
    _no_top_level_ids(kwargs, "search")
    check_threshold(threshold)
    top_k = check_top_k(kwargs.pop("limit", top_k))  # Mem0 1.x's name for top_k
    query = check_query(query)
    return {"results": (yield from plans.search(config, query, parse(filters), top_k, False, explain))}


def _update(config: Config, memory_id, text, metadata, expiration_date, data) -> Plan[dict]:
    text = text if text is not None else data
    if text is None and metadata is None and expiration_date is _UNSET:
        raise ValidationError("At least one of text, metadata, or expiration_date must be provided.")
    refuse(expiration_date=None if expiration_date is _UNSET else expiration_date)  # None clears: nothing to clear
    if text is not None or metadata is not None:
        yield from plans.update(config, memory_id, text, metadata)
    return {"message": "Memory updated successfully!"}


def _delete(config: Config, memory_id) -> Plan[dict]:
    yield from plans.delete(config, memory_id)
    return {"message": "Memory deleted successfully!"}


def _delete_all(config: Config, user_id, agent_id, run_id) -> Plan[dict]:
    ids = plans.entity_ids(user_id, agent_id, run_id, required=(
        "At least one filter is required to delete all memories. If you want to delete all memories, use the "
        "`reset()` method."))
    yield from plans.delete_all(config, ids)
    return {"message": "Memories deleted successfully!"}


# -- blocking ---------------------------------------------------------------------------------------
class Memory:
    """Mem0's `Memory`, on a memstream server (the package docstring says what maps to what).
    `config`: `{"url", "api_key", "tenant_id", "wait_seconds", "strategy"}`; none given, as
    `Memory()`, the server and key come from MEMSTREAM_URL and MEMSTREAM_API_KEY."""

    def __init__(self, config: Optional[Dict[str, Any]] = None):
        cfg = _settings(config)
        self._config = _config(cfg)
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

    def _run(self, plan: Plan[Any]) -> Any:
        return plans.run(plan, self.client)

    def add(self, messages, *, user_id: Optional[str] = None, agent_id: Optional[str] = None,
            run_id: Optional[str] = None, metadata: Optional[Dict[str, Any]] = None, timestamp: Optional[Any] = None,
            expiration_date: Optional[Any] = None, infer: bool = True, memory_type: Optional[str] = None,
            prompt: Optional[str] = None):
        """Each non-system message becomes a memory, searchable when this returns (`infer` and
        `prompt` change nothing: nothing is extracted or rewritten)."""
        return self._run(_add(self._config, messages, user_id, agent_id, run_id, metadata, timestamp, expiration_date,
                              memory_type))

    def get(self, memory_id):
        """The memory's latest version, or None."""
        return self._run(plans.get(memory_id))

    def get_all(self, *, filters: Optional[Dict[str, Any]] = None, top_k: int = 20, show_expired: bool = False,
                **kwargs):
        """Up to `top_k` memories matching `filters` (filters.py), oldest first."""
        return self._run(_get_all(filters, top_k, kwargs))

    def search(self, query: str, *, top_k: int = 20, filters: Optional[Dict[str, Any]] = None, threshold: float = 0.1,
               rerank: bool = False, explain: bool = False, reference_date: Optional[Any] = None,
               show_expired: bool = False, **kwargs):
        """memstream's retrieval in the boundary `filters` names, at most `top_k` (or Mem0 1.x's
        `limit`) memories — its `max_turns` — each with its evidence unit's `score`; `threshold` is
        not applied (package docstring), `rerank` changes nothing, `explain` adds `score_details`."""
        return self._run(_search(self._config, query, top_k, filters, threshold, explain, reference_date, kwargs))

    def update(self, memory_id, text: Optional[str] = None, metadata: Optional[Dict[str, Any]] = None,
               expiration_date: Any = _UNSET, data: Optional[str] = None):
        return self._run(_update(self._config, memory_id, text, metadata, expiration_date, data))

    def delete(self, memory_id):
        return self._run(_delete(self._config, memory_id))

    def delete_all(self, user_id: Optional[str] = None, agent_id: Optional[str] = None, run_id: Optional[str] = None):
        return self._run(_delete_all(self._config, user_id, agent_id, run_id))

    def history(self, memory_id):
        return self._run(plans.history(memory_id))

    def reset(self):
        """Forgets the whole tenant: an admin key naming it (config `tenant_id`)."""
        self._run(plans.reset(self._config))


# -- asyncio ----------------------------------------------------------------------------------------
class AsyncMemory:
    """Mem0's `AsyncMemory`: `Memory`'s methods as coroutines (`llm` changes nothing)."""

    def __init__(self, config: Optional[Dict[str, Any]] = None):
        cfg = _settings(config)
        self._config = _config(cfg)
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

    async def _run(self, plan: Plan[Any]) -> Any:
        return await plans.arun(plan, self.client)

    async def add(self, messages, *, user_id: Optional[str] = None, agent_id: Optional[str] = None,
                  run_id: Optional[str] = None, metadata: Optional[Dict[str, Any]] = None,
                  timestamp: Optional[Any] = None, expiration_date: Optional[Any] = None, infer: bool = True,
                  memory_type: Optional[str] = None, prompt: Optional[str] = None, llm=None):
        return await self._run(_add(self._config, messages, user_id, agent_id, run_id, metadata, timestamp,
                                    expiration_date, memory_type))

    async def get(self, memory_id):
        return await self._run(plans.get(memory_id))

    async def get_all(self, *, filters: Optional[Dict[str, Any]] = None, top_k: int = 20, show_expired: bool = False,
                      **kwargs):
        return await self._run(_get_all(filters, top_k, kwargs))

    async def search(self, query: str, *, top_k: int = 20, filters: Optional[Dict[str, Any]] = None,
                     threshold: float = 0.1, rerank: bool = False, explain: bool = False,
                     reference_date: Optional[Any] = None, show_expired: bool = False, **kwargs):
        return await self._run(_search(self._config, query, top_k, filters, threshold, explain, reference_date,
                                       kwargs))

    async def update(self, memory_id, text: Optional[str] = None, metadata: Optional[Dict[str, Any]] = None,
                     expiration_date: Any = _UNSET, data: Optional[str] = None):
        return await self._run(_update(self._config, memory_id, text, metadata, expiration_date, data))

    async def delete(self, memory_id):
        return await self._run(_delete(self._config, memory_id))

    async def delete_all(self, user_id=None, agent_id=None, run_id=None):
        return await self._run(_delete_all(self._config, user_id, agent_id, run_id))

    async def history(self, memory_id):
        return await self._run(plans.history(memory_id))

    async def reset(self):
        await self._run(plans.reset(self._config))
