"""Mem0's hosted-platform clients, `MemoryClient` and `AsyncMemoryClient`, on a memstream server:
mem0ai 2.2.1's method names and parameters for the memory operations (a test compares them with
its source), its `options` models or keyword arguments, and the same mapping as `Memory`
(plans.py). `host` is the memstream server and `api_key` a memstream key (defaults:
MEMSTREAM_URL, MEMSTREAM_API_KEY). Writes return once searchable: `add` answers with the stored
memories, never a queued event.

Config memstream has no use for — those steering an LLM's extraction or the response format
(`infer`, `custom_instructions`, `custom_categories`, `output_format`, `version`, `async_mode`…),
`rerank`, `threshold`, `show_expired`, `latest_only`, `keyword_search` — change nothing; options
that would change what is kept or returned (`expiration_date`, `app_id`, `categories`,
`reference_date`) raise NotSupported; any other name raises ValidationError naming it.

Only the memory operations are offered: the platform's other services (exports, summaries,
profiles, project settings, webhooks, feedback, chat) have no counterpart here, and `users()`
raises NotSupported (memstream does not list entities). `reset()` and `delete_users()` without an
id forget the whole tenant, which needs an admin key — and an admin key must name a tenant, which
this constructor cannot: use `Memory({"tenant_id": …})` or `memstream forget` for that.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Dict, List, Optional

from memstream_client.client import AsyncClient, Client
from memstream_client.compat.mem0 import plans
from memstream_client.compat.mem0.errors import NotSupported, ValidationError
from memstream_client.compat.mem0.filters import IDS, Filters, parse
from memstream_client.compat.mem0.plans import Config, Plan, check_query, check_threshold, check_top_k, refuse
from memstream_client.errors import NotFound

ENTITY_PARAMS = (*IDS, "app_id")
FORMAT_AND_EXTRACTION = {"infer", "custom_instructions", "agent_custom_instructions", "custom_categories",
                         "structured_data_schema", "includes", "excludes", "version", "output_format", "async_mode",
                         "enable_graph", "prompt"}
PAGE_SIZE = 100  # get_all's page when none is asked for


def _merged(options: Any, kwargs: dict[str, Any], method: str, known: set[str], ignored: set[str] = frozenset()):
    """Typed options (a pydantic model such as mem0's AddMemoryOptions, or a dict) and keyword
    arguments as one dict, keyword arguments winning, as mem0ai merges them; unknown names refused."""
    if options is None:
        given = {}
    elif hasattr(options, "model_dump"):
        given = options.model_dump(exclude_unset=True)
    elif isinstance(options, dict):
        given = dict(options)
    else:
        raise ValidationError(f"{method}(): options must be a dict or an options model, not {type(options).__name__}")
    given.update(kwargs)
    unknown = sorted(set(given) - known - ignored)
    if unknown:
        raise ValidationError(f"{method}(): unknown option(s) {unknown}; memstream's MemoryClient takes "
                              f"{sorted(known)}")
    return {k: v for k, v in given.items() if k not in ignored}


def _no_top_level_entities(kwargs: dict[str, Any], method: str) -> None:
    top = sorted(set(kwargs) & set(ENTITY_PARAMS))
    if top:
        raise ValidationError(f"Top-level entity parameters {set(top)} are not supported in {method}(). "
                              f"Use filters={{'user_id': '...'}} instead.")


def _and(a: Filters, b: Filters) -> Filters:
    return Filters({**a.ids, **b.ids}, lambda record: a.test(record) and b.test(record), a.narrows or b.narrows)


def _dates(start_date: Any, end_date: Any) -> Filters | None:
    bounds = {op: value for op, value in (("gte", start_date), ("lte", end_date)) if value is not None}
    return parse({"created_at": bounds}, require_id=False) if bounds else None


# -- the operations as plans --------------------------------------------------------------------------
def _add(config: Config, messages, options: Any, kwargs: dict[str, Any]) -> Plan[dict]:
    o = _merged(options, kwargs, "add", {"user_id", "agent_id", "run_id", "app_id", "metadata", "filters", "timestamp",
                                         "expiration_date"}, FORMAT_AND_EXTRACTION)
    refuse(app_id=o.get("app_id"), expiration_date=o.get("expiration_date"))
    scope = o.get("filters") or {}
    if not isinstance(scope, dict):
        raise ValidationError(f"add(): filters must be a dict, not {type(scope).__name__}")
    ids = plans.entity_ids(*(o.get(k, scope.get(k)) for k in IDS),
                           required="At least one of user_id, agent_id or run_id must be provided (app_id is not "
                                    "supported).")
    return (yield from plans.add(config, messages, ids, o.get("metadata"), o.get("timestamp")))


def _get(memory_id) -> Plan[dict]:
    found = yield from plans.get(memory_id, missing_ok=False)
    if found is None:
        raise NotFound(f"Memory with id {memory_id} not found")
    return found


def _get_all(options: Any, kwargs: dict[str, Any]) -> Plan[dict]:
    _no_top_level_entities(kwargs, "get_all")
    o = _merged(options, kwargs, "get_all", {"filters", "page", "page_size", "start_date", "end_date", "categories",
                                            "show_expired", "latest_only"})
    refuse(categories=o.get("categories"))
    page, size = o.get("page") or 1, o.get("page_size") or PAGE_SIZE
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in (page, size)):
        raise ValidationError(f"get_all(): page and page_size must be positive integers, not {page!r}, {size!r}")
    flt = parse(o.get("filters"), platform=True, require_id=False)
    dates = _dates(o.get("start_date"), o.get("end_date"))
    found, more = yield from plans.get_all(_and(flt, dates) if dates else flt, size, True, skip=(page - 1) * size)
    return {"count": len(found), "next": page + 1 if more else None, "previous": page - 1 if page > 1 else None,
            "results": found}


def _search(config: Config, query, options: Any, kwargs: dict[str, Any]) -> Plan[dict]:
    _no_top_level_entities(kwargs, "search")
    o = _merged(options, kwargs, "search", {
        "filters", "metadata", "top_k", "limit", "rerank", "threshold", "fields", "categories", "show_expired",
        "reference_date", "latest_only", "keyword_search"})
    refuse(categories=o.get("categories"), reference_date=o.get("reference_date"))
    check_threshold(o.get("threshold"))
    top_k = o.get("top_k", o.get("limit"))  # limit: Mem0 1.x's name for it
    top_k = None if top_k is None else check_top_k(top_k)
    flt = parse(o.get("filters"), platform=True, require_id=False)
    if o.get("metadata"):
        flt = _and(flt, parse({"metadata": o["metadata"]}, platform=True, require_id=False))
    found = yield from plans.search(config, check_query(query), flt, top_k, True)
    fields = o.get("fields")
    if fields:
        found = [{k: v for k, v in m.items() if k in fields or k == "id"} for m in found]
    return {"results": found}


def _update(config: Config, memory_id, options: Any, kwargs: dict[str, Any]) -> Plan[dict]:
    o = _merged(options, kwargs, "update", {"text", "metadata", "timestamp", "expiration_date"})
    o = {k: v for k, v in o.items() if v is not None or k == "expiration_date"}
    if not o:
        raise ValidationError("At least one of text, metadata, timestamp, or expiration_date must be provided for "
                              "update.")
    refuse(expiration_date=o.get("expiration_date"))  # None clears an expiry: there is none to clear
    if {"text", "metadata", "timestamp"} & set(o):
        yield from plans.update(config, memory_id, o.get("text"), o.get("metadata"), o.get("timestamp"),
                                missing=NotFound)
    return (yield from _get(memory_id))


def _delete(config: Config, memory_id) -> Plan[dict]:
    yield from plans.delete(config, memory_id, missing=NotFound)
    return {"message": "Memory deleted successfully!"}


def _delete_all(config: Config, options: Any, kwargs: dict[str, Any]) -> Plan[dict]:
    o = _merged(options, kwargs, "delete_all", {"filters", *ENTITY_PARAMS})
    refuse(app_id=o.get("app_id"))
    scope = dict(o.get("filters") or {})
    extra = sorted(set(scope) - set(IDS))
    if extra:
        raise ValidationError(f"delete_all() takes user_id, agent_id and run_id (as arguments or in filters), "
                              f"not {extra}")
    ids = plans.entity_ids(*(o.get(k, scope.get(k)) for k in IDS), required=(
        "delete_all() needs user_id, agent_id or run_id; reset() deletes every memory of the tenant"))
    yield from plans.delete_all(config, ids)
    return {"message": "Memories deleted successfully!"}


def _delete_users(config: Config, user_id, agent_id, app_id, run_id) -> Plan[dict]:
    refuse(app_id=app_id)
    for name, value in (("user_id", user_id), ("agent_id", agent_id), ("run_id", run_id)):
        if value:  # the first one given, as mem0ai's delete_users
            yield from plans.delete_all(config, plans.entity_ids(**{"user_id": None, "agent_id": None,
                                                                    "run_id": None, name: value}))
            return {"message": "Entity deleted successfully."}
    yield from plans.reset(config)
    return {"message": "All users, agents, apps and runs deleted."}


def _batch_update(config: Config, memories) -> Plan[dict]:
    positions = []
    for m in _batch(memories, "batch_update"):
        _, at = yield from plans.correct(m["memory_id"], m.get("text"), m.get("metadata"), m.get("timestamp"), NotFound)
        positions.append(at)
    yield from plans.settle(config, positions)
    return {"message": f"Successfully updated {len(memories)} memories"}


def _batch_delete(config: Config, memories) -> Plan[dict]:
    positions = []
    for m in _batch(memories, "batch_delete"):
        positions += yield from plans.erase(m["memory_id"], NotFound)
    yield from plans.settle(config, positions)
    return {"message": f"Successfully deleted {len(memories)} memories"}


def _batch(memories: Any, method: str) -> list[dict[str, Any]]:
    if not isinstance(memories, list) or not all(isinstance(m, dict) and m.get("memory_id") for m in memories):
        raise ValidationError(f"{method}() takes a list of dicts, each with a 'memory_id'")
    return memories


def _reset(config: Config) -> Plan[dict]:
    yield from plans.reset(config)
    return {"message": "Client reset successful. All users and memories deleted."}


USERS = ("memstream does not list users, agents and runs; list a user's memories with "
         "get_all(filters={'user_id': ...})")


class _Platform:
    def __init__(self, api_key: Optional[str], host: Optional[str], client: Any):
        if client is not None:
            raise NotSupported("client= is not supported: memstream's MemoryClient makes its own HTTP client "
                               "(pass host= and api_key=)")
        self.api_key = api_key if api_key is not None else os.environ.get("MEMSTREAM_API_KEY")
        self.host = host or os.environ.get("MEMSTREAM_URL")
        self.user_id = hashlib.md5(self.api_key.encode()).hexdigest() if self.api_key else None
        self.config = Config()  # writes wait until searchable, up to config.wait_seconds


# -- blocking ---------------------------------------------------------------------------------------
class MemoryClient(_Platform):
    """Mem0's `MemoryClient` on a memstream server (module docstring)."""

    def __init__(self, api_key: Optional[str] = None, host: Optional[str] = None, client: Optional[Any] = None):
        super().__init__(api_key, host, client)
        self.client = Client(self.host, self.api_key)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> "MemoryClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self, plan: Plan[Any]) -> Any:
        return plans.run(plan, self.client)

    def add(self, messages, options: Optional[Any] = None, **kwargs) -> Dict[str, Any]:
        return self._run(_add(self.config, messages, options, kwargs))

    def get(self, memory_id: str) -> Dict[str, Any]:
        return self._run(_get(memory_id))

    def get_all(self, options: Optional[Any] = None, **kwargs) -> Dict[str, Any]:
        return self._run(_get_all(options, kwargs))

    def search(self, query: str, options: Optional[Any] = None, **kwargs) -> Dict[str, Any]:
        return self._run(_search(self.config, query, options, kwargs))

    def update(self, memory_id: str, options: Optional[Any] = None, **kwargs) -> Dict[str, Any]:
        return self._run(_update(self.config, memory_id, options, kwargs))

    def delete(self, memory_id: str, delete_linked: bool = False) -> Dict[str, Any]:
        """Every version of the memory, whatever `delete_linked` (an update's versions are one memory)."""
        return self._run(_delete(self.config, memory_id))

    def delete_all(self, options: Optional[Any] = None, **kwargs) -> Dict[str, str]:
        return self._run(_delete_all(self.config, options, kwargs))

    def history(self, memory_id: str) -> List[Dict[str, Any]]:
        return self._run(plans.history(memory_id))

    def users(self) -> Dict[str, Any]:
        raise NotSupported(USERS)

    def delete_users(self, user_id: Optional[str] = None, agent_id: Optional[str] = None,
                     app_id: Optional[str] = None, run_id: Optional[str] = None) -> Dict[str, str]:
        return self._run(_delete_users(self.config, user_id, agent_id, app_id, run_id))

    def reset(self) -> Dict[str, str]:
        """Forgets the whole tenant: an admin key (and its tenant as the client's)."""
        return self._run(_reset(self.config))

    def batch_update(self, memories: List[Dict[str, Any]]) -> Dict[str, Any]:
        return self._run(_batch_update(self.config, memories))

    def batch_delete(self, memories: List[Dict[str, Any]]) -> Dict[str, Any]:
        return self._run(_batch_delete(self.config, memories))


# -- asyncio ----------------------------------------------------------------------------------------
class AsyncMemoryClient(_Platform):
    """Mem0's `AsyncMemoryClient`: `MemoryClient`'s methods as coroutines."""

    def __init__(self, api_key: Optional[str] = None, host: Optional[str] = None, client: Optional[Any] = None):
        super().__init__(api_key, host, client)
        self.async_client = AsyncClient(self.host, self.api_key)

    async def aclose(self) -> None:
        await self.async_client.aclose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, exc_type, exc_val, exc_tb):
        await self.aclose()

    async def _run(self, plan: Plan[Any]) -> Any:
        return await plans.arun(plan, self.async_client)

    async def add(self, messages, options: Optional[Any] = None, **kwargs) -> Dict[str, Any]:
        return await self._run(_add(self.config, messages, options, kwargs))

    async def get(self, memory_id: str) -> Dict[str, Any]:
        return await self._run(_get(memory_id))

    async def get_all(self, options: Optional[Any] = None, **kwargs) -> Dict[str, Any]:
        return await self._run(_get_all(options, kwargs))

    async def search(self, query: str, options: Optional[Any] = None, **kwargs) -> Dict[str, Any]:
        return await self._run(_search(self.config, query, options, kwargs))

    async def update(self, memory_id: str, options: Optional[Any] = None, **kwargs) -> Dict[str, Any]:
        return await self._run(_update(self.config, memory_id, options, kwargs))

    async def delete(self, memory_id: str, delete_linked: bool = False) -> Dict[str, Any]:
        return await self._run(_delete(self.config, memory_id))

    async def delete_all(self, options: Optional[Any] = None, **kwargs) -> Dict[str, str]:
        return await self._run(_delete_all(self.config, options, kwargs))

    async def history(self, memory_id: str) -> List[Dict[str, Any]]:
        return await self._run(plans.history(memory_id))

    async def users(self) -> Dict[str, Any]:
        raise NotSupported(USERS)

    async def delete_users(self, user_id: Optional[str] = None, agent_id: Optional[str] = None,
                           app_id: Optional[str] = None, run_id: Optional[str] = None) -> Dict[str, str]:
        return await self._run(_delete_users(self.config, user_id, agent_id, app_id, run_id))

    async def reset(self) -> Dict[str, str]:
        return await self._run(_reset(self.config))

    async def batch_update(self, memories: List[Dict[str, Any]]) -> Dict[str, Any]:
        return await self._run(_batch_update(self.config, memories))

    async def batch_delete(self, memories: List[Dict[str, Any]]) -> Dict[str, Any]:
        return await self._run(_batch_delete(self.config, memories))
