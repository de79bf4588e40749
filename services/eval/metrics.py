"""LoCoMo evaluation rules, written down once.

Categories follow the official LoCoMo code: 1 multi-hop, 2 temporal, 3 open-domain,
4 single-hop, 5 adversarial (no evidence; excluded from recall).

Evidence ids are `D<session>:<turn>`. The tolerant parsing rule: split every listed item on
';' and whitespace; read `D:11:26` as `D11:26`; read zero-padded numbers as integers; drop
tokens that still do not parse. Questions with no parseable evidence are skipped (760 of the
dev split's 762 category 1–4 questions remain). A gold id naming a turn that does not exist
(`D10:19`) is kept: it simply can never be found.

Evidence recall at a turn budget B: take the returned units in rank order, each contributing
its turns in time order, until B distinct turns; recall = share of the gold turns among them.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Iterable, Sequence

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
_EVIDENCE = re.compile(r"^D:?(\d+):(\d+)$")


def parse_evidence(items: Iterable) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for item in items or []:
        for token in re.split(r"[;\s]+", str(item)):
            m = _EVIDENCE.match(token.strip())
            if m:
                ref = (int(m.group(1)), int(m.group(2)))
                if ref not in out:
                    out.append(ref)
    return out


def parse_ref(ref: str | None) -> tuple[int, int] | None:
    m = _EVIDENCE.match(ref or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def budget_turns(units: Sequence[Sequence[str]], budget: int) -> list[str]:
    """Distinct turns of the ranked units (each unit's turns in time order) up to `budget`."""
    seen: list[str] = []
    have: set[str] = set()
    for turns in units:
        for t in turns:
            if t not in have:
                have.add(t)
                seen.append(t)
                if len(seen) == budget:
                    return seen
    return seen


def recall_at(units: Sequence[Sequence[str]], gold: set[str], budget: int) -> float:
    if not gold:
        return 0.0
    return len(set(budget_turns(units, budget)) & gold) / len(gold)


# -- answer metrics (LoCoMo's token F1 and BLEU-1) ------------------------------------------
_ARTICLES = re.compile(r"\b(a|an|the|and)\b")


def normalize_answer(s: str) -> str:
    s = str(s).lower().replace(",", "")
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def token_f1(prediction: str, truth: str) -> float:
    p, t = normalize_answer(prediction).split(), normalize_answer(truth).split()
    common = Counter(p) & Counter(t)
    same = sum(common.values())
    if not p or not t or same == 0:
        return 0.0
    precision, recall = same / len(p), same / len(t)
    return 2 * precision * recall / (precision + recall)


def bleu1(prediction: str, truth: str) -> float:
    import math

    p, t = normalize_answer(prediction).split(), normalize_answer(truth).split()
    if not p or not t:
        return 0.0
    clipped = sum((Counter(p) & Counter(t)).values())
    precision = clipped / len(p)
    bp = 1.0 if len(p) > len(t) else math.exp(1 - len(t) / len(p))
    return bp * precision


def multi_hop_f1(prediction: str, truth: str) -> float:
    """LoCoMo scores multi-hop answers item by item: each gold item against its best prediction item."""
    preds = [x.strip() for x in str(prediction).split(",") if x.strip()]
    golds = [x.strip() for x in str(truth).split(",") if x.strip()]
    if not preds or not golds:
        return token_f1(prediction, truth)
    return sum(max(token_f1(p, g) for p in preds) for g in golds) / len(golds)
