"""Model ports: the encoder (dense vectors) and the entity extractor (NER).

Both are deterministic for fixed model files. Neither is an LLM: they run locally and never
open a network connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True)
class EncodedText:
    vector: np.ndarray  # L2-normalised mean-pooled embedding
    mean: np.ndarray  # unnormalised mean of token embeddings (for pooling into windows)
    tokens: int  # number of tokens pooled
    spans: np.ndarray  # one L2-normalised vector per requested character span ("late chunking")


class TokenStates(Protocol):
    """One text's encoding with its token states kept, so that spans found later (the
    question's entities) can be pooled without a second forward pass."""

    vector: np.ndarray  # L2-normalised pooled embedding, as `encode` gives

    def pool(self, spans: list[tuple[int, int]]) -> np.ndarray:
        """One L2-normalised vector per character span, shape (len(spans), dim)."""
        ...


class Encoder(Protocol):
    model_name: str
    dim: int

    def encode(self, texts: list[str]) -> np.ndarray:
        """L2-normalised embeddings, shape (len(texts), dim), float32."""
        ...

    def encode_with_spans(self, texts: list[str], spans: list[list[tuple[int, int]]]) -> list[EncodedText]:
        """Encode each text once and also pool its token states over the given character spans."""
        ...

    def encode_states(self, text: str) -> TokenStates:
        """Encode one text and keep its token states (thread-safe)."""
        ...

    def submit_states(self, text: str) -> "Pending[TokenStates]":
        """`encode_states` started off the caller's thread, returning at once: the query path
        computes what needs no vector (profile, BM25) while the model runs on the other core."""
        ...


class Pending(Protocol[T_co]):
    def result(self) -> T_co:
        """Wait for the value (re-raises the computation's error)."""
        ...


@dataclass(frozen=True)
class EntityMention:
    text: str
    label: str
    start: int
    end: int


@dataclass(frozen=True)
class AnalyzedText:
    sentences: list[tuple[int, int]]  # character spans
    mentions: list[EntityMention]


class EntityExtractor(Protocol):
    model_name: str

    def analyze(self, texts: list[str]) -> list[AnalyzedText]: ...

    def label_glossary(self) -> dict[str, str]:
        """Each entity label the model predicts, with the model's own description of it."""
        ...
