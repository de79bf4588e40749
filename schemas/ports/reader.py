"""Reader port: the optional final-QA reader, the only LLM in memstream.

Nothing else may open an LLM connection: construction, routing, retrieval, closure and both
calibrations are deterministic code (tests/e2e/test_zero_tokens.py proves it at run time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class ReaderReply:
    text: str
    model: str
    prompt_tokens: int
    completion_tokens: int


class Reader(Protocol):
    model: str

    def answer(self, question: str, evidence_lines: list[str]) -> ReaderReply:
        """Answer from the evidence only; each line is '[date] Speaker: text'."""
        ...
