"""/v1/answer: search, then the reader (the only LLM call), then deterministic answer calibration."""

from __future__ import annotations

import time

from schemas.errors import BadRequest
from schemas.ports.reader import Reader
from schemas.query import AnswerResponse, Evidence, SearchRequest
from services.query.answers import calibrate, extract_candidates
from services.query.profile import answer_type


def evidence_turns(evidence: list[Evidence]):
    """Distinct evidence turns in evidence order (each unit's turns in time order)."""
    seen = set()
    for e in evidence:
        for t in e.turns:
            if t.turn_id not in seen:
                seen.add(t.turn_id)
                yield t


def evidence_lines(evidence: list[Evidence]) -> list[str]:
    return [f"[{t.occurred_at.day} {t.occurred_at:%B %Y}] {t.speaker}: {t.text}" for t in evidence_turns(evidence)]


def answer(service, reader: Reader | None, request: SearchRequest) -> AnswerResponse:
    if reader is None:
        raise BadRequest("no reader is configured: set MEMSTREAM_READER_URL (and _MODEL, _API_KEY) to an OpenAI-compatible endpoint")
    result = service.search(request)
    lines = evidence_lines(result.evidence)
    t0 = time.perf_counter()
    reply = reader.answer(request.question, lines)
    reader_ms = (time.perf_counter() - t0) * 1000
    t1 = time.perf_counter()
    atype = answer_type(request.question)
    candidates = extract_candidates([(t.turn_id, t.text, t.occurred_at) for t in evidence_turns(result.evidence)], atype)
    final, info = calibrate(reply.text, atype, candidates, "\n".join(lines))
    timings = {**result.timings_ms, "reader": round(reader_ms, 3), "answer_calibration": round((time.perf_counter() - t1) * 1000, 3)}
    return AnswerResponse(
        **{**result.model_dump(), "timings_ms": timings, "llm_tokens": reply.prompt_tokens + reply.completion_tokens},
        answer=final, reader_answer=reply.text,
        calibration={**info, "answer_type": atype, "candidates": [c.text for c in candidates[:20]]},
        reader_model=reply.model, reader_usage={"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens},
    )
