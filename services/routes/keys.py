"""Key management over HTTP (admin): list, create, revoke, rotate. A new secret is in the answer
once and nowhere else; `control_offset` is what POST /v1/wait takes to know every process
enforces the change."""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from schemas.events import TENANT_PATTERN
from schemas.security import Role
from services import keys
from services.paging import MAX_LIMIT, page
from services.routes.deps import Admin, state

router = APIRouter()


class NewKey(BaseModel):
    role: Role
    tenant_id: str | None = Field(None, pattern=TENANT_PATTERN, description="Required for reader and writer keys; none for admin keys.")
    name: str = Field("", max_length=200)


class Rotation(BaseModel):
    grace_seconds: float = Field(keys.DEFAULT_GRACE.total_seconds(), ge=0, le=30 * 86400,
                                 description="How long the previous secret keeps working (default 24 h).")


@router.get("/v1/admin/keys", summary="Every key, without secrets (admin)")
async def list_keys(request: Request, principal: Admin, tenant_id: str | None = Query(None, pattern=TENANT_PATTERN),
                    cursor: str | None = Query(None, max_length=400, description="`next_cursor` of the previous page."),
                    limit: int = Query(100, ge=1, le=MAX_LIMIT)):
    ring = state(request).keyring
    await ring.refresh(force=True)
    listed, next_cursor = page(ring.listing(tenant_id), lambda k: (k["key_id"],), (str,), cursor, limit)
    return {"keys": listed, "next_cursor": next_cursor}


@router.post("/v1/admin/keys", summary="Create a key; the secret is shown once (admin)", status_code=201)
async def create_key(body: NewKey, request: Request, principal: Admin):
    change = await keys.create(state(request).keyring, body.role, body.tenant_id, body.name, by=f"key:{principal.key_id}")
    return change.as_dict()


@router.post("/v1/admin/keys/{key_id}/revoke", summary="Revoke a key (admin)")
async def revoke_key(key_id: str, request: Request, principal: Admin):
    return (await keys.revoke(state(request).keyring, key_id, by=f"key:{principal.key_id}")).as_dict()


@router.post("/v1/admin/keys/{key_id}/rotate", summary="New secret for a key; the old one works for the grace period (admin)")
async def rotate_key(key_id: str, request: Request, principal: Admin, body: Rotation | None = None):
    grace = timedelta(seconds=(body or Rotation()).grace_seconds)
    return (await keys.rotate(state(request).keyring, key_id, grace, by=f"key:{principal.key_id}")).as_dict()
