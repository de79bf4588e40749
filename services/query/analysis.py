"""Query-side text analysis: the shared analysis of schemas/text.py, plus question words,
which are dropped from keywords because every question has them."""

from __future__ import annotations

from schemas.text import TOKEN, stem, stop_words, tokens

QUESTION_WORDS = frozenset({
    "when", "what", "who", "whom", "whose", "where", "which", "why", "how", "did", "does", "do", "is", "are", "was",
    "were", "has", "have", "had", "would", "could", "can", "will", "should", "might", "may",
})

__all__ = ["QUESTION_WORDS", "TOKEN", "keywords", "keyword_words", "stem", "stop_words", "tokens"]


def keyword_words(question: str) -> list[str]:
    """Content words of a question (unstemmed), in order, without question words."""
    stops = stop_words()
    return [t for t in TOKEN.findall(question.lower()) if t not in stops and t not in QUESTION_WORDS]


def keywords(question: str) -> list[str]:
    """Stemmed content words of a question."""
    return stem(keyword_words(question))
