"""Key management over HTTP (admin): list, create, revoke, rotate. A new secret is in the answer
once and nowhere else; `control_offset` is what POST /v1/wait takes to know every process
enforces the change."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam
from pydantic import BaseModel, ConfigDict, Field

from schemas.rules import TENANT_PATTERN, Name
from schemas.security import KEY_ID_PATTERN, Role
from services import keys
from services.paging import KEYS, MAX_LIMIT, page
from services.routes.deps import Admin, state
from services.routes.models import KeyChange, KeyList, NewSecret
from services.routes.responses import errors

router = APIRouter()
KeyId = PathParam(pattern=KEY_ID_PATTERN, description="The key's public id (16 hex characters).")


def _new_key_schema(schema: dict[str, Any]) -> None:
    """The role decides the tenant: an admin key has none, a reader or writer key exactly one."""
    schema["oneOf"] = [
        {"properties": {"role": {"const": "admin"}}, "not": {"required": ["tenant_id"]}},
        {"properties": {"role": {"enum": ["reader", "writer"]}, "tenant_id": {"type": "string"}}, "required": ["tenant_id"]},
    ]


class NewKey(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_new_key_schema)
    role: Role
    tenant_id: str = Field(None, pattern=TENANT_PATTERN, description="Required for reader and writer keys; absent for admin keys.")
    name: Name = Field("", max_length=200, description="What the key is for (shown in listings and the audit trail).")


class Rotation(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    grace_seconds: float = Field(keys.DEFAULT_GRACE.total_seconds(), ge=0, le=30 * 86400,
                                 description="How long the previous secret keeps working (default 24 h).")


@router.get("/v1/admin/keys", summary="Every key, without secrets (admin)", response_model=KeyList, responses=errors(400))
async def list_keys(request: Request, principal: Admin, tenant_id: str | None = Query(None, pattern=TENANT_PATTERN),
                    cursor: str | None = Query(None, pattern=KEYS.pattern, description="`next_cursor` of the previous page."),
                    limit: int = Query(100, ge=1, le=MAX_LIMIT)):
    ring = state(request).keyring
    await ring.refresh(force=True)
    listed, next_cursor = page(ring.listing(tenant_id), lambda k: (k["key_id"],), KEYS, cursor, limit)
    return {"keys": listed, "next_cursor": next_cursor}


@router.post("/v1/admin/keys", summary="Create a key; the secret is shown once (admin)", status_code=201, response_model=NewSecret)
async def create_key(body: NewKey, request: Request, principal: Admin):
    change = await keys.create(state(request).keyring, body.role, body.tenant_id, body.name, by=f"key:{principal.key_id}")
    return change.as_dict()


@router.post("/v1/admin/keys/{key_id}/revoke", summary="Revoke a key (admin)", response_model=KeyChange, responses=errors(404))
async def revoke_key(request: Request, principal: Admin, key_id: str = KeyId):
    return (await keys.revoke(state(request).keyring, key_id, by=f"key:{principal.key_id}")).as_dict()


@router.post("/v1/admin/keys/{key_id}/rotate", summary="New secret for a key; the old one works for the grace period (admin)",
             response_model=NewSecret, responses=errors(404, 409, _409="The key is revoked"))
async def rotate_key(request: Request, principal: Admin, key_id: str = KeyId, body: Rotation | None = None):
    grace = timedelta(seconds=(body or Rotation()).grace_seconds)
    return (await keys.rotate(state(request).keyring, key_id, grace, by=f"key:{principal.key_id}")).as_dict()
