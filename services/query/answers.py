"""Answer calibration (paper eq. 16): typed candidates A(q) from the evidence, then a
deterministic check of the reader's answer. No model is called here.

Candidates:
- dates: absolute dates, months and years in the evidence, and relative expressions resolved
  against the session date of the turn that says them ("yesterday" said on 8 May 2023 ->
  "7 May 2023"; "last week" -> "the week before 8 May 2023"; "last Friday" -> "the Friday before
  8 May 2023"; "last year" -> "2022"; "3 years ago" -> "2020");
- numbers: digits and number words;
- names: runs of capitalised words that are not sentence-initial function words.

Calibration keeps the reader's answer a0 when it is supported by the evidence and well-formed
for the answer type; otherwise it normalises (strips filler), shortens extractively to a
type-compatible candidate it contains, prunes unsupported list items, and replaces a scalar
answer only by a *unique* type-compatible candidate. Failing all that, a0 is kept.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from services.query.analysis import tokens
from services.query.profile import MONTHS, WEEKDAYS

_NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty".split())}
_NUMBER_WORDS.update({"thirty": 30, "forty": 40, "fifty": 50, "hundred": 100, "once": 1, "twice": 2, "a couple": 2})
_MONTH_RE = "(" + "|".join(MONTHS) + ")"
_ABS_DMY = re.compile(r"\b(\d{1,2})(?:st|nd|rd|th)? " + _MONTH_RE + r",? (\d{4})\b", re.I)
_ABS_MDY = re.compile(r"\b" + _MONTH_RE + r" (\d{1,2})(?:st|nd|rd|th)?,? (\d{4})\b", re.I)
_ABS_MY = re.compile(r"\b" + _MONTH_RE + r",? (\d{4})\b", re.I)
_YEAR = re.compile(r"\b(19\d\d|20\d\d)\b")
_REL = re.compile(
    r"\b(yesterday|today|tonight|this morning|last night|"
    r"(?:last|this past) (?:week|weekend|month|year|" + "|".join(WEEKDAYS) + r")|"
    r"next (?:week|weekend|month|year)|"
    r"(\d+|" + "|".join(k for k in _NUMBER_WORDS if " " not in k) + r"|a|a few|a couple of) (day|week|weekend|month|year)s? ago)\b", re.I)
_NUMBER = re.compile(r"\b(\d+(?:\.\d+)?|" + "|".join(_NUMBER_WORDS) + r")\b", re.I)
_NAME = re.compile(r"\b([A-Z][a-z'’]+(?: [A-Z][a-z'’]+)*)\b")
_FILLER = re.compile(r"^(the answer is|answer|it was|it is)\s*:?\s+", re.I)


def fmt_day(d: date) -> str:
    return f"{d.day} {calendar.month_name[d.month]} {d.year}"


@dataclass(frozen=True)
class AnswerCandidate:
    text: str
    kind: str  # date | number | name
    value: Any
    turn_id: str


def _amount(word: str) -> int:
    w = word.lower()
    if w.isdigit():
        return int(w)
    if w in ("a", "an"):
        return 1
    if w in ("a few",):
        return 3
    if w in ("a couple of",):
        return 2
    return _NUMBER_WORDS.get(w, 1)


def resolve_relative(phrase: str, said_on: date) -> tuple[str, Any] | None:
    """A relative phrase resolved against the day it was said; None when it has no answer
    (also near the ends of the calendar: stored data must never make a search fail)."""
    try:
        return _resolve_relative(phrase, said_on)
    except (OverflowError, ValueError):
        return None


def _resolve_relative(phrase: str, said_on: date) -> tuple[str, Any] | None:
    p = phrase.lower()
    if p == "yesterday" or p == "last night":
        d = said_on - timedelta(days=1)
        return fmt_day(d), d
    if p in ("today", "tonight", "this morning"):
        return fmt_day(said_on), said_on
    m = re.fullmatch(r"(?:last|this past) (\w+)", p)
    if m:
        unit = m.group(1)
        if unit in ("week", "weekend"):
            return f"the {unit} before {fmt_day(said_on)}", ("before", unit, said_on)
        if unit in WEEKDAYS:
            return f"the {unit.capitalize()} before {fmt_day(said_on)}", ("before", unit, said_on)
        if unit == "month":
            y, mo = (said_on.year, said_on.month - 1) if said_on.month > 1 else (said_on.year - 1, 12)
            return f"{calendar.month_name[mo]} {y}", (y, mo)
        if unit == "year":
            return str(said_on.year - 1), said_on.year - 1
    m = re.fullmatch(r"next (\w+)", p)
    if m:
        unit = m.group(1)
        if unit == "month":
            y, mo = (said_on.year, said_on.month + 1) if said_on.month < 12 else (said_on.year + 1, 1)
            return f"{calendar.month_name[mo]} {y}", (y, mo)
        if unit == "year":
            return str(said_on.year + 1), said_on.year + 1
        return f"the {unit} after {fmt_day(said_on)}", ("after", unit, said_on)
    m = re.fullmatch(r"(.+?) (day|week|weekend|month|year)s? ago", p)
    if m:
        n, unit = _amount(m.group(1)), m.group(2)
        if unit == "year":
            return str(said_on.year - n), said_on.year - n
        if unit == "day":
            d = said_on - timedelta(days=n)
            return fmt_day(d), d
        if unit == "month":
            total = said_on.year * 12 + said_on.month - 1 - n
            y, mo = divmod(total, 12)
            return f"{calendar.month_name[mo + 1]} {y}", (y, mo + 1)
        return f"{m.group(1)} {unit}s before {fmt_day(said_on)}", ("before", unit, said_on)
    return None


def extract_candidates(turns: list[tuple[str, str, datetime]], answer_type: str) -> list[AnswerCandidate]:
    """`turns`: (turn id, text, occurred_at) of the evidence, in rank order."""
    out: list[AnswerCandidate] = []
    seen: set[tuple[str, str]] = set()

    def add(text: str, kind: str, value: Any, tid: str) -> None:
        key = (kind, text.lower())
        if key not in seen:
            seen.add(key)
            out.append(AnswerCandidate(text, kind, value, tid))

    for tid, text, when in turns:
        said_on = when.date()
        for m in _ABS_DMY.finditer(text):
            d = date(int(m.group(3)), MONTHS.index(m.group(2).lower()) + 1, int(m.group(1)))
            add(fmt_day(d), "date", d, tid)
        for m in _ABS_MDY.finditer(text):
            d = date(int(m.group(3)), MONTHS.index(m.group(1).lower()) + 1, int(m.group(2)))
            add(fmt_day(d), "date", d, tid)
        for m in _ABS_MY.finditer(text):
            add(f"{m.group(1).capitalize()} {m.group(2)}", "date", (int(m.group(2)), MONTHS.index(m.group(1).lower()) + 1), tid)
        for m in _REL.finditer(text):
            r = resolve_relative(m.group(1), said_on)
            if r:
                add(r[0], "date", r[1], tid)
        for m in _YEAR.finditer(text):
            add(m.group(1), "date", int(m.group(1)), tid)
        for m in _NUMBER.finditer(text):
            word = m.group(1)
            if _YEAR.fullmatch(word):
                continue
            add(word, "number", float(word) if word[0].isdigit() else _NUMBER_WORDS[word.lower()], tid)
        for m in _NAME.finditer(text):
            name = m.group(1)
            start = m.start()
            if start == 0 or text[max(0, start - 2):start].strip() in (".", "!", "?"):
                if " " not in name:
                    continue  # a sentence-initial capital is not evidence of a name
            add(name, "name", name, tid)
    wanted = {"date": ("date",), "duration": ("date", "number"), "number": ("number",), "person": ("name",), "place": ("name",)}
    kinds = wanted.get(answer_type)
    return [c for c in out if kinds is None or c.kind in kinds]


def _supported(answer: str, evidence_text: str) -> float:
    a = set(tokens(answer))
    if not a:
        return 0.0
    return len(a & set(tokens(evidence_text))) / len(a)


def _well_formed(answer: str, answer_type: str) -> bool:
    low = answer.lower()
    if answer_type == "date":
        return bool(_YEAR.search(answer) or re.search(_MONTH_RE, low) or re.search(r"\b(before|after|week|weekend)\b", low))
    if answer_type in ("number", "duration"):
        return bool(_NUMBER.search(answer))
    if answer_type == "yesno":
        return bool(re.match(r"^(yes|no|likely|probably|unknown)\b", low))
    return bool(answer.strip())


def calibrate(a0: str, answer_type: str, candidates: list[AnswerCandidate], evidence_text: str) -> tuple[str, dict[str, Any]]:
    """Deterministic answer calibration; returns the final answer and what was done."""
    a = _FILLER.sub("", a0.strip()).strip().rstrip(".")
    info: dict[str, Any] = {"candidates": len(candidates)}
    typed = list(candidates)
    if answer_type == "list":
        items = [x.strip() for x in re.split(r",|;| and ", a) if x.strip()]
        kept = [x for x in items if _supported(x, evidence_text) >= 0.5]
        if kept and len(kept) < len(items):
            info["action"] = "pruned"
            return ", ".join(kept), info
    if _well_formed(a, answer_type) and (_supported(a, evidence_text) >= 0.5 or any(c.text.lower() in a.lower() for c in typed)):
        # Shorten extractively when a long answer contains exactly one typed candidate.
        inside = [c for c in typed if c.text.lower() in a.lower()]
        if answer_type in ("date", "number", "person", "place") and len(a.split()) > 6 and len({c.text for c in inside}) == 1:
            info["action"] = "shortened"
            return inside[0].text, info
        info["action"] = "kept" if a == a0.strip() else "normalised"
        return a, info
    if answer_type in ("date", "number", "duration", "person", "place"):
        distinct = {c.text for c in typed}
        if len(distinct) == 1:
            info["action"] = "replaced"
            return typed[0].text, info
    info["action"] = "kept" if a == a0.strip() else "normalised"
    return a, info


def gold_in_candidates(gold: str, candidates: list[AnswerCandidate]) -> bool:
    """Whether a gold answer appears among the typed candidates (same normalised text, or the
    same date/number value)."""
    g = str(gold).strip().lower()
    for c in candidates:
        if c.text.lower() == g or (c.text.lower() in g and len(c.text) >= 4):
            return True
        if c.kind == "number":
            m = _NUMBER.search(g)
            if m and (m.group(1).isdigit() and float(m.group(1)) == c.value):
                return True
    return False
