"""GET /v1/export: a tenant's memory as JSON Lines (the tenant's writer key, or an admin key naming
the tenant) — the raw turns still held, which `memstream ingest jsonl` re-imports
(services/export.py)."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from schemas.events import encode_event
from schemas.rules import ID_MAX, ID_PATTERN, TENANT_PATTERN
from services.auth import tenant_for
from services.export import export_turns, record_export
from services.routes.deps import Writer, state

router = APIRouter()


@router.get("/v1/export", summary="A tenant's memory: the raw turns still held, as JSON Lines (writer; admin names the tenant)",
            response_class=StreamingResponse,
            responses={200: {"content": {"application/x-ndjson": {"schema": {"type": "string", "description": "One TurnRecorded per line."}}},
                             "description": "The turns, in log order, each event once; forgotten turns are left out"}})
async def get_export(request: Request, principal: Writer,
                     tenant_id: str | None = Query(None, pattern=TENANT_PATTERN, description="Default: the key's tenant."),
                     conversation_id: str | None = Query(None, pattern=ID_PATTERN, max_length=ID_MAX,
                                                          description="Only this conversation.")):
    st = state(request)
    tenant = tenant_for(principal, tenant_id)
    log_, topic = st.pipeline.log, st.settings.log.topic
    turns = export_turns(log_, topic, st.pipeline.keystore, tenant, conversation_id)
    first = await anext(turns, None)  # errors before the first byte (the log is down) get the usual error answer

    async def lines():
        count, complete = 0, False
        try:
            if first is not None:
                yield encode_event(first) + b"\n"
                count = 1
                async for event in turns:
                    yield encode_event(event) + b"\n"
                    count += 1
            complete = True
        finally:
            await record_export(log_, topic, tenant, conversation_id, count, complete, f"key:{principal.key_id}")

    name = f"{tenant}-{conversation_id}" if conversation_id else tenant
    return StreamingResponse(lines(), media_type="application/x-ndjson",
                             headers={"Content-Disposition": f'attachment; filename="memstream-{_safe(name)}.jsonl"'})


def _safe(name: str) -> str:
    """A file name for the header: ASCII letters, digits and -_. only (a header is latin-1, and ids may be any printable text)."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in name)[:120]
