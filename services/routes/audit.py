"""GET /v1/admin/audit (admin): the audit trail, a page at a time (services/audit.py)."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request

from schemas.rules import TENANT_PATTERN, Time
from services.audit import decode_cursor, encode_cursor
from services.paging import AUDIT
from services.routes.deps import Admin, state
from services.routes.models import AuditPage
from services.routes.responses import errors

router = APIRouter()


@router.get("/v1/admin/audit", summary="The audit trail: key changes, retention, forgets and their completion, exports (admin)",
            response_model=AuditPage, responses=errors(400))
async def get_audit(request: Request, principal: Admin,
                    tenant_id: str | None = Query(None, pattern=TENANT_PATTERN, description="Only this tenant's entries."),
                    since: Time | None = Query(None, description="Only entries at or after this time."),
                    cursor: str | None = Query(None, pattern=AUDIT.pattern, description="`next_cursor` of the previous page."),
                    limit: int = Query(100, ge=1, le=1000)):
    trail = state(request).audit
    await trail.refresh()
    entries, after = trail.page(tenant_id=tenant_id, since=since, after=decode_cursor(cursor) if cursor else -1, limit=limit)
    return {"entries": entries, "next_cursor": encode_cursor(after) if after is not None else None}
