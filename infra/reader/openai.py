"""Reader on any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, llama.cpp, …).

This module is the only code path in memstream that sends text to an LLM.
"""

from __future__ import annotations

import httpx

from schemas.errors import ConfigurationError, ReaderError
from schemas.ports.reader import ReaderReply

SYSTEM = (
    "You answer questions about past conversations using only the evidence given. "
    "Each evidence line starts with the date of its session. Resolve relative dates (e.g. 'yesterday', "
    "'last week') against that date. Answer with a short phrase, not a sentence. "
    "If the evidence does not contain the answer, say 'unknown'."
)


class OpenAICompatibleReader:
    def __init__(self, url: str, model: str, api_key: str | None = None, timeout: float = 60.0):
        if not url:
            raise ConfigurationError("no reader configured: set MEMSTREAM_READER_URL to an OpenAI-compatible endpoint (…/v1)")
        self.url = url.rstrip("/")
        self.model = model
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout)

    def answer(self, question: str, evidence_lines: list[str]) -> ReaderReply:
        prompt = "Evidence:\n" + "\n".join(evidence_lines) + f"\n\nQuestion: {question}\nShort answer:"
        body = {"model": self.model, "temperature": 0, "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]}
        try:
            r = self._client.post(f"{self.url}/chat/completions", json=body, headers=self._headers)
            r.raise_for_status()
            data = r.json()
            text = data["choices"][0]["message"]["content"].strip()
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            raise ReaderError(f"reader at {self.url} failed: {exc}") from exc
        usage = data.get("usage") or {}
        return ReaderReply(text, data.get("model", self.model), int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))

    def close(self) -> None:
        self._client.close()
