"""The OpenAPI document, completed: FastAPI states each route's own request and answers; this adds
what the routes share, so that the document names every status an operation can give and the
schema of every body (services/routes/responses.py has the error shape):

- behind a key: 401, 403, 429 (and `security`);
- a state-changing method: 400 (a body that is not UTF-8 JSON memstream accepts), 413, 415, and 403
  (a foreign origin), all from the edge guard (services/http_guard.py);
- any input at all: 422 (in the one error shape, not FastAPI's);
- a store or the log behind it: 503;
- the event schemas, and `EventIn`: an event as POST /v1/events takes it (`tenant_id` optional);
- this server's limits where a request's schema depends on them (batch size, longest wait).
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import TypeAdapter

from schemas.events import Event
from services.routes.ingest import default_wait
from services.routes.responses import DESCRIPTIONS, ErrorResponse

ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}
UNSAFE = {"post", "put", "patch", "delete"}
NO_STORE = {"/healthz", "/dashboard/assets/{name}"}


def complete(doc: dict[str, Any], *, open_paths: tuple[str, ...], max_batch: int, max_wait: float) -> dict[str, Any]:
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    _events(schemas)
    schemas["ErrorInfo"] = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")["$defs"]["ErrorInfo"]
    schemas["ErrorResponse"] = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas["ErrorResponse"].pop("$defs", None)
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer",
                                                "description": "An API key (memstream keys create)."}}
    for path, operations in doc["paths"].items():
        for method, op in operations.items():
            statuses: set[int] = {422} if op.get("parameters") or op.get("requestBody") else set()
            if path not in open_paths:
                op["security"] = [{"bearer": []}]
                statuses |= {401, 403, 429}
            if method in UNSAFE:  # a body may come with any of them, and the edge guard reads it
                statuses |= {400, 403, 413, 415}
            if path not in NO_STORE:
                statuses.add(503)
            responses = op.setdefault("responses", {})
            for status in sorted(statuses):
                responses.setdefault(str(status), {"description": DESCRIPTIONS[status]})
            for status, response in responses.items():
                if status.startswith(("4", "5")):
                    response["content"] = {"application/json": {"schema": ERROR_REF}}
    _limits(doc, max_batch, max_wait)
    return doc


def _events(schemas: dict[str, Any]) -> None:
    """The event schemas (as the JSON Schema files state them), and their `…In` variants."""
    defs = TypeAdapter(Event).json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(defs.pop("$defs", {}))
    schemas["Event"] = defs
    variants = {}
    for name in ("TurnRecorded", "ForgetRequested"):
        variant = copy.deepcopy(schemas[name])
        variant["required"] = [r for r in variant["required"] if r != "tenant_id"]
        variant["properties"]["tenant_id"]["description"] = "Default: the key's tenant."
        schemas[f"{name}In"] = variants[name] = variant
    schemas["EventIn"] = {
        "oneOf": [{"$ref": f"#/components/schemas/{name}In"} for name in variants],
        "discriminator": {"propertyName": "type",
                          "mapping": {name: f"#/components/schemas/{name}In" for name in variants}},
    }


def _limits(doc: dict[str, Any], max_batch: int, max_wait: float) -> None:
    body = doc["paths"]["/v1/events"]["post"]["requestBody"]["content"]
    for media in body.values():
        schema = media["schema"]
        for batch in (schema, *schema.get("oneOf", ())):
            if batch.get("type") == "array":
                batch["maxItems"] = max_batch
            elif "events" in batch.get("properties", {}):
                batch["properties"]["events"]["maxItems"] = max_batch
    wait = doc["components"]["schemas"]["WaitRequest"]["properties"]["timeout_seconds"]
    wait["maximum"], wait["default"] = max_wait, default_wait(max_wait)
