"""Retrieval: POST /v1/search (evidence, zero LLM tokens) and POST /v1/answer (plus the reader)."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Request
from pydantic import Field

from schemas.query import AnswerResponse, SearchRequest, SearchResponse
from schemas.rules import TENANT_PATTERN
from services.auth import tenant_for
from services.routes.deps import Reader, state
from services.routes.responses import errors

router = APIRouter()


class SearchBody(SearchRequest):
    """A search as the API takes it: `tenant_id` defaults to the key's tenant."""

    tenant_id: str | None = Field(None, pattern=TENANT_PATTERN, description="Default: the key's tenant (admin keys must name one).")


def _request(body: SearchBody, principal) -> SearchRequest:
    tenant = tenant_for(principal, body.tenant_id)
    return SearchRequest.model_validate({**body.model_dump(), "tenant_id": tenant})


@router.post("/v1/search", response_model=SearchResponse, summary="Evidence for a question (zero LLM tokens; reader)")
async def post_search(body: SearchBody, request: Request, principal: Reader):
    st = state(request)
    response = await asyncio.to_thread(st.query.search, _request(body, principal))
    st.monitor.query_done(response.strategy, response.timings_ms.get("total", 0.0), response.timings_ms)
    return response


@router.post("/v1/answer", response_model=AnswerResponse, summary="Evidence, then the reader's calibrated answer (one LLM call; reader)",
             responses={**errors(400, _400="No reader is configured on this server (MEMSTREAM_READER_URL), or the body is "
                                           "not JSON memstream accepts"),
                        502: {"model": errors(400)[400]["model"], "description": "The reader endpoint failed"}})
async def post_answer(body: SearchBody, request: Request, principal: Reader):
    from services.query.answering import answer

    st = state(request)
    req = _request(body, principal)
    t0 = time.perf_counter()
    response = await asyncio.to_thread(answer, st.query, st.reader, req)
    st.monitor.query_done(req.strategy, (time.perf_counter() - t0) * 1000, {})
    return response
