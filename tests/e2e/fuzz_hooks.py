"""Schemathesis hooks for the API fuzz (tests/e2e/test_api_fuzz.py), loaded by `schemathesis run`
through SCHEMATHESIS_HOOKS=tests.e2e.fuzz_hooks.

They only put real names where generated ones would name nothing, and never repair a value: a
generated value is replaced only when it is itself valid (so a request generated to break a rule
still breaks it), and then, some of the time, by a real one of the same kind — a key id of the
keys made for the run to revoke or rotate, an event id of the sample's, the key's own tenant,
the sample's conversation, a dashboard asset's name, the ops token. Cursors need no help: every
string their pattern allows is a position (services/paging.py). The real values come from the
JSON file named by MEMSTREAM_FUZZ_REAL (written by the test before the run).

They also say how to send the one media type schemathesis has no serializer for: JSON Lines, the
array the document describes, one event per line."""

from __future__ import annotations

import json
import os
import re
from functools import cache
from typing import Any

import schemathesis
from hypothesis import strategies as st

from schemas.rules import ID_PATTERN, TENANT_PATTERN
from schemas.security import KEY_ID_PATTERN
from services.routes.dashboard import ASSET_PATTERN

KEEP = "keep"


@cache
def real() -> dict[str, Any]:
    with open(os.environ["MEMSTREAM_FUZZ_REAL"], encoding="utf-8") as f:
        return json.load(f)


def _sometimes(values: list, generated: Any, pattern: str, weight: int = 3) -> st.SearchStrategy:
    """One of `values` `weight` times in `weight + 1` if `generated` is a valid value (a string
    matching `pattern`), else what was generated."""
    if not (isinstance(generated, str) and re.fullmatch(pattern, generated)):
        return st.just(generated)
    return st.sampled_from([*values] * weight + [KEEP]).map(lambda v: generated if v == KEEP else v)


def _label(context) -> str:
    return f"{context.operation.method.upper()} {context.operation.path}"


@schemathesis.serializer("application/x-ndjson")
def to_json_lines(ctx, value: Any) -> bytes:
    items = value if isinstance(value, list) else [value]
    return b"".join(json.dumps(item, ensure_ascii=False).encode("utf-8", "surrogatepass") + b"\n" for item in items)


@schemathesis.hook
def flatmap_query(context, query):
    if not query:
        return st.just(query)
    r = real()
    parts = {}
    if "tenant_id" in query:
        parts["tenant_id"] = _sometimes([r["tenant"]], query["tenant_id"], TENANT_PATTERN)
    if "conversation_id" in query:
        parts["conversation_id"] = _sometimes([r["conversation"]], query["conversation_id"], ID_PATTERN)
    if not parts:
        return st.just(query)
    return st.fixed_dictionaries(parts).map(lambda chosen: {**query, **chosen})


@schemathesis.hook
def flatmap_path_parameters(context, params):
    params = dict(params or {})
    r, path = real(), context.operation.path
    if "key_id" in params:
        victims = r["victims"]["revoke" if path.endswith("/revoke") else "rotate"]
        return _sometimes(victims, params["key_id"], KEY_ID_PATTERN).map(lambda v: {**params, "key_id": v})
    if "event_id" in params:
        return _sometimes(r["event_ids"], params["event_id"], ID_PATTERN).map(lambda v: {**params, "event_id": v})
    if "name" in params and path.startswith("/dashboard/assets"):
        return _sometimes(r["assets"], params["name"], ASSET_PATTERN).map(lambda v: {**params, "name": v})
    return st.just(params)


@schemathesis.hook
def flatmap_body(context, body):
    r, label = real(), _label(context)
    if isinstance(body, dict) and label in ("POST /v1/search", "POST /v1/answer"):
        parts = {}
        if "tenant_id" in body:
            parts["tenant_id"] = _sometimes([r["tenant"]], body["tenant_id"], TENANT_PATTERN)
        if "conversation_id" in body:
            parts["conversation_id"] = _sometimes([r["conversation"]], body["conversation_id"], ID_PATTERN)
        return st.fixed_dictionaries(parts).map(lambda chosen: {**body, **chosen})
    if isinstance(body, dict) and label == "POST /dashboard/session" and "token" in body:
        return _sometimes([r["ops_token"]], body["token"], "^.{1,512}$", weight=1).map(lambda v: {**body, "token": v})
    return st.just(body)
