"""The declared fast model path: a hashing encoder and a lexicon NER. NOT language models.

For tests and benchmarks where the models are not the point (fault injection, crash recovery,
scale runs): they are deterministic, need no model files, load in microseconds and run thousands
of texts per second, so a 300-turn fault test costs the pipeline's time, not the models'. Their
retrieval quality is far below the real models' and nothing here is tuned for it.

- `HashingEncoder` (MEMSTREAM_ENCODER_MODEL=hashing, or hashing-<dim>): a token's vector is a
  signed one-hot of its stemmed word hashed (BLAKE2b) into `dim` buckets; a text's vector is the
  L2-normalised mean of its tokens' — feature hashing over the same word rules as BM25
  (schemas/text.py). Token states and span pooling follow the real encoder's contract.
- `LexiconExtractor` (MEMSTREAM_NER_MODEL=lexicon): runs of capitalised words that do not open a
  sentence, plus words the caller declares (a lexicon), labelled NAME; sentences by the shared
  rule-based splitter.
Both say what they are in `model_name`, which the eval, status and benchmarks print.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np

from schemas.ports.models import AnalyzedText, EncodedText, EntityMention
from schemas.text import split_sentences

_TOKEN = re.compile(r"[A-Za-z0-9]+(?:['’][A-Za-z]+)?")
_NAME_RUN = re.compile(r"\b[A-Z][a-z]+(?:[ -][A-Z][a-z]+)*\b")


def _normalize(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.maximum(n, 1e-12)).astype(np.float32)


class _States:
    def __init__(self, vectors: np.ndarray, offsets: np.ndarray, dim: int):
        self.hidden, self.offsets = vectors, offsets
        self._pooled = vectors.mean(axis=0) if len(vectors) else np.zeros(dim, np.float32)
        self.vector = _normalize(self._pooled[None, :])[0]

    def pool(self, spans: list[tuple[int, int]]) -> np.ndarray:
        if not spans:
            return np.zeros((0, len(self._pooled)), dtype=np.float32)
        out = []
        for s, e in spans:
            sel = (self.offsets[:, 0] >= s) & (self.offsets[:, 1] <= e) if len(self.offsets) else np.zeros(0, bool)
            out.append(self.hidden[sel].mean(axis=0) if sel.any() else self._pooled)
        return _normalize(np.stack(out))


class _Done:
    def __init__(self, value):
        self._value = value

    def result(self):
        return self._value


class HashingEncoder:
    """Feature hashing of stemmed words (module docstring). Thread-safe and stateless."""

    def __init__(self, dim: int = 256):
        self.dim = dim
        self.model_name = f"hashing-{dim} (fast path: feature hashing, not a language model)"
        self.load_seconds = 0.0
        self._bucket: dict[str, tuple[int, float]] = {}

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def _slot(self, word: str) -> tuple[int, float]:
        slot = self._bucket.get(word)
        if slot is None:
            from schemas.text import stem

            h = hashlib.blake2b(stem([word.lower()])[0].encode(), digest_size=8).digest()
            slot = (int.from_bytes(h[:4], "little") % self.dim, 1.0 if h[4] & 1 else -1.0)
            if len(self._bucket) < 200_000:
                self._bucket[word] = slot
        return slot

    def _states(self, text: str) -> _States:
        matches = list(_TOKEN.finditer(text))
        vectors = np.zeros((len(matches), self.dim), dtype=np.float32)
        offsets = np.zeros((len(matches), 2), dtype=np.int64)
        for i, m in enumerate(matches):
            j, sign = self._slot(m.group(0))
            vectors[i, j] = sign
            offsets[i] = (m.start(), m.end())
        return _States(vectors, offsets, self.dim)

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self._states(t).vector for t in texts])

    def encode_with_spans(self, texts: list[str], spans: list[list[tuple[int, int]]]) -> list[EncodedText]:
        out = []
        for text, sp in zip(texts, spans):
            s = self._states(text)
            mean = s.hidden.mean(axis=0).astype(np.float32) if len(s.hidden) else np.zeros(self.dim, np.float32)
            out.append(EncodedText(vector=s.vector, mean=mean, tokens=len(s.hidden), spans=s.pool(sp)))
        return out

    def encode_states(self, text: str) -> _States:
        return self._states(text)

    def submit_states(self, text: str):
        return _Done(self._states(text))


class LexiconExtractor:
    """Capitalised runs not opening a sentence, and declared words, as NAME mentions (module docstring)."""

    model_name = "lexicon (fast path: capitalised names, not a language model)"

    def __init__(self, lexicon: tuple[str, ...] = ()):
        self.lexicon = tuple(sorted({w.strip() for w in lexicon if w.strip()}, key=len, reverse=True))
        self._declared = re.compile(r"\b(" + "|".join(re.escape(w) for w in self.lexicon) + r")\b", re.I) if self.lexicon else None

    def start(self) -> None:
        pass

    def label_glossary(self) -> dict[str, str]:
        return {"NAME": "a capitalised name or a declared word (lexicon NER, fast path)"}

    def analyze(self, texts: list[str]) -> list[AnalyzedText]:
        out = []
        for text in texts:
            sentences = split_sentences(text)
            starts = {s for s, _ in sentences}
            found: dict[tuple[int, int], EntityMention] = {}
            for m in _NAME_RUN.finditer(text):
                start, end = m.start(), m.end()
                if start in starts:  # a sentence's first word is capitalised anyway: keep the rest of the run
                    rest = re.match(r"[A-Z][a-z]+[ -]?", text[start:end])
                    start += rest.end() if rest else 0
                    if start >= end or not text[start].isupper():
                        continue
                found[(start, end)] = EntityMention(text[start:end], "NAME", start, end)
            if self._declared is not None:
                for m in self._declared.finditer(text):
                    found.setdefault((m.start(), m.end()), EntityMention(m.group(0), "NAME", m.start(), m.end()))
            out.append(AnalyzedText(sentences=sentences, mentions=[found[k] for k in sorted(found)]))
        return out
