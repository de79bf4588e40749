"""Deterministic text helpers shared by projections and the query side.

Written by hand on purpose: they must give identical results in every projection (the graph
projection's sentences must match the dense projection's sentence vectors) and in producers
written in other languages, so they avoid model-dependent behaviour.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

# A sentence ends at . ! ? (possibly repeated, possibly followed by closing quotes/brackets)
# when whitespace follows. Common abbreviations do not end sentences.
_SENT_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s+)")
_ABBREV = {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "no", "approx", "mt", "ft"}
_WORD = re.compile(r"[A-Za-z0-9]+(?:['’][A-Za-z]+)?")


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Character spans of sentences, covering all non-space text, in order."""
    spans: list[tuple[int, int]] = []
    start = 0
    for m in _SENT_END.finditer(text):
        end = m.end()
        before = text[start:m.start()].rstrip()
        last_word = before.rsplit(None, 1)[-1].lower() if before else ""
        if m.group(0).startswith(".") and last_word.rstrip(".") in _ABBREV:
            continue
        if text[start:end].strip():
            spans.append(_trim(text, start, end))
        start = end
    if text[start:].strip():
        spans.append(_trim(text, start, len(text)))
    return spans


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end)


_POSSESSIVE = re.compile(r"(?:['’]s|s['’])$")
_EDGE_PUNCT = re.compile(r"^[\W_]+|[\W_]+$")
_SPACES = re.compile(r"\s+")


def normalize_entity(name: str) -> str:
    """Merge key for entity names: case, whitespace, possessives, edge punctuation, leading 'the'."""
    s = unicodedata.normalize("NFKC", name).lower().strip()
    s = _SPACES.sub(" ", s)
    s = _EDGE_PUNCT.sub("", s)
    if s.endswith("s'") or s.endswith("s’"):
        s = s[:-1]
    else:
        s = _POSSESSIVE.sub("", s)
    if s.startswith("the "):
        s = s[4:]
    return s.strip()


def words(text: str) -> list[str]:
    """Lower-cased word tokens (letters/digits, keeping inner apostrophes)."""
    return [w.lower() for w in _WORD.findall(text)]


# -- lexical analysis shared by keyword graph nodes and the query side --------------------------
# Lower-case words of two or more characters, Lucene's English stop words (via bm25s), Snowball
# English stems (PyStemmer) — the same analysis as the lexical index's en_stem tokenizer.
TOKEN = re.compile(r"(?u)\b\w\w+\b")


@lru_cache(maxsize=1)
def _stop_words() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


@lru_cache(maxsize=1)
def _stemmer():
    import Stemmer

    return Stemmer.Stemmer("english")


def stop_words() -> frozenset[str]:
    return _stop_words()


def stem(words: list[str]) -> list[str]:
    return _stemmer().stemWords(words)


def tokens(text: str, *, stemmed: bool = True, drop_stop: bool = True) -> list[str]:
    toks = TOKEN.findall(text.lower())
    if drop_stop:
        stops = _stop_words()
        toks = [t for t in toks if t not in stops]
    return stem(toks) if stemmed else toks


def content_words(text: str) -> list[tuple[int, int, str, str]]:
    """(start, end, word, stem) of every non-stop word of two or more characters."""
    stops = _stop_words()
    found = [(m.start(), m.end(), m.group(0).lower()) for m in TOKEN.finditer(text)]
    found = [f for f in found if f[2] not in stops]
    stems = stem([f[2] for f in found])
    return [(a, b, w, s) for (a, b, w), s in zip(found, stems)]
