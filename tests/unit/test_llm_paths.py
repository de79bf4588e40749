"""Statically, the reader adapter is the only code that talks to an LLM endpoint (the run-time
proof is tests/e2e/test_query_api.py: a counting reader and refused outbound connections)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {"infra/reader/openai.py", "services/eval/zero_tokens.py"}  # the reader; the test/eval counting proxy
# `memstream bench load` and `bench query` are clients of memstream itself, on a loopback address only (check_loopback)
HTTP_ALLOWED = ALLOWED | {"services/bench/load.py", "services/bench/query.py"}


def test_only_the_reader_opens_llm_connections():
    pattern = re.compile(r"chat/completions|openai|anthropic|/v1/completions", re.I)
    offenders = []
    for package in ("schemas", "streams", "services", "infra"):
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ALLOWED:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line) and "OpenAICompatibleReader" not in line and "OpenAI-compatible" not in line:
                    offenders.append(f"{rel}:{n}: {line.strip()}")
    assert offenders == []


def test_http_clients_are_only_used_by_the_reader_and_the_eval_proxy():
    users = sorted(p.relative_to(ROOT).as_posix() for pkg in ("schemas", "streams", "services", "infra")
                   for p in (ROOT / pkg).rglob("*.py") if re.search(r"^\s*import httpx|^\s*from httpx", p.read_text(), re.M))
    assert set(users) <= HTTP_ALLOWED, users
