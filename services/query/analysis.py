"""Query-side text analysis, matching the lexical index's (tantivy en_stem: lower-case, Snowball
English stemming). Stop words are Lucene's English list (via bm25s); question words are dropped
from keywords because every question has them."""

from __future__ import annotations

import re
from functools import lru_cache

from bm25s.stopwords import STOPWORDS_EN

_TOKEN = re.compile(r"(?u)\b\w\w+\b")
STOP_WORDS = frozenset(STOPWORDS_EN)
QUESTION_WORDS = frozenset({
    "when", "what", "who", "whom", "whose", "where", "which", "why", "how", "did", "does", "do", "is", "are", "was",
    "were", "has", "have", "had", "would", "could", "can", "will", "should", "might", "may",
})


@lru_cache(maxsize=1)
def _stemmer():
    import Stemmer

    return Stemmer.Stemmer("english")


def tokens(text: str, *, stem: bool = True, drop_stop: bool = True) -> list[str]:
    toks = _TOKEN.findall(text.lower())
    if drop_stop:
        toks = [t for t in toks if t not in STOP_WORDS]
    return _stemmer().stemWords(toks) if stem else toks


def keywords(question: str) -> list[str]:
    """Content keywords of a question (stemmed), in order, without question words."""
    raw = [t for t in _TOKEN.findall(question.lower()) if t not in STOP_WORDS and t not in QUESTION_WORDS]
    return _stemmer().stemWords(raw)


def stem(words: list[str]) -> list[str]:
    return _stemmer().stemWords(words)
