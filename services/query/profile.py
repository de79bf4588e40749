"""The query profile φ(q) (paper eq. 6): subject, keywords, answer type, temporal cues, boundary.

Everything comes from the question's form and the boundary's own data — never from answers
and never from an LLM. The rules are generic English question forms (when / how many / who /
where / did …), calendar expressions and ordering words; none was built from the evaluation
questions' wording.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from schemas.text import normalize_entity
from services.query.analysis import keywords

MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november", "december"]
WEEKDAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
VALUE_LABELS = frozenset({"CARDINAL", "ORDINAL", "PERCENT", "QUANTITY", "MONEY", "DATE", "TIME"})

_PLACE_NOUNS = r"(city|cities|country|countries|state|states|place|places|location|locations|town|towns|area|areas|region|regions)"
_YES_NO_STARTS = {"did", "does", "do", "is", "are", "was", "were", "has", "have", "would", "could", "can", "will", "should"}
_ORDER = re.compile(r"\b(first|last|before|after|recent(ly)?|latest|earliest|previous(ly)?|since|until|ago)\b", re.I)
_RELATIVE = re.compile(r"\b(yesterday|today|tonight|(last|next|this|past) (week|weekend|month|year))\b", re.I)
_MON = "(" + "|".join(m.capitalize() for m in MONTHS) + ")"
_D_DMY = re.compile(r"\b(\d{1,2}) " + _MON + r",? (\d{4})\b", re.I)
_D_MDY = re.compile(r"\b" + _MON + r" (\d{1,2}),? (\d{4})\b", re.I)
_D_MY = re.compile(r"\b" + _MON + r",? (\d{4})\b", re.I)
_D_Y = re.compile(r"\b(19\d\d|20\d\d)\b")

_NOT_NOUNS = frozenset({"is", "are", "was", "were", "does", "did", "do", "has", "have", "had", "would", "could", "can", "will",
                        "should", "might", "may", "the", "a", "an", "his", "her", "their", "my", "your", "our", "its", "kind",
                        "kinds", "type", "types", "sort", "sorts", "of", "to", "in", "on", "for", "about", "made", "happened"})
_ANSWER_NOUN = re.compile(r"\b(?:what|which)\s+(?:(?:kinds?|types?|sorts?) of\s+)?([a-z]+)", re.I)


def answer_noun(question: str) -> str | None:
    """The noun a what/which question asks for ("What books …" -> "books"), if any."""
    m = _ANSWER_NOUN.search(question)
    if m and m.group(1).lower() not in _NOT_NOUNS:
        return m.group(1).lower()
    return None


ANSWER_TYPES = ("date", "duration", "number", "place", "person", "yesno", "list", "description")


def answer_type(question: str) -> str:
    """Expected answer type from the question form."""
    s = question.lower().strip()
    words = re.findall(r"[a-z']+", s)
    first = words[0] if words else ""
    if re.search(r"\bhow (long|many years|many months|many weeks|many days)\b", s):
        return "duration"
    if first == "when" or re.search(r"\b(what|which) (year|month|date|day|time)\b", s):
        return "date"
    if re.search(r"\bhow (many|much|often)\b", s):
        return "number"
    if first == "where" or re.search(r"\b(what|which)( \w+)? " + _PLACE_NOUNS + r"\b", s):
        return "place"
    if first in ("who", "whom", "whose") or re.search(r"\b(with|by) whom\b", s):
        return "person"
    if first in _YES_NO_STARTS:
        return "yesno"
    if re.search(r"\b(what|which) (\w+ )?\w+s\b", s) and not re.search(r"\b(what|which) (is|does|was|has)\b", s):
        return "list"
    return "description"


def absolute_interval(question: str) -> tuple[date, date] | None:
    """An absolute day, month or year named in the question, as a date interval."""
    if m := _D_DMY.search(question):
        d = date(int(m.group(3)), MONTHS.index(m.group(2).lower()) + 1, int(m.group(1)))
        return d, d
    if m := _D_MDY.search(question):
        d = date(int(m.group(3)), MONTHS.index(m.group(1).lower()) + 1, int(m.group(2)))
        return d, d
    if m := _D_MY.search(question):
        y, mo = int(m.group(2)), MONTHS.index(m.group(1).lower()) + 1
        return date(y, mo, 1), date(y, mo, calendar.monthrange(y, mo)[1])
    if m := _D_Y.search(question):
        y = int(m.group(1))
        return date(y, 1, 1), date(y, 12, 31)
    return None


def relative_interval(question: str, as_of: datetime | None) -> tuple[date, date] | None:
    """'yesterday', 'last week', 'this month'… resolved against `as_of`; None when it has no
    answer — including when `as_of` is so near the ends of the calendar that the interval would
    leave it (stored data must never make a search fail)."""
    try:
        return _relative_interval(question, as_of)
    except (OverflowError, ValueError):
        return None


def _relative_interval(question: str, as_of: datetime | None) -> tuple[date, date] | None:
    if as_of is None:
        return None
    m = _RELATIVE.search(question)
    if not m:
        return None
    today = as_of.date()
    phrase = m.group(0).lower()
    if phrase == "yesterday":
        d = today - timedelta(days=1)
        return d, d
    if phrase in ("today", "tonight"):
        return today, today
    when, unit = phrase.split()
    if unit in ("week", "weekend"):
        start = today - timedelta(days=today.weekday())
        if when in ("last", "past"):
            return start - timedelta(days=7), start - timedelta(days=1)
        if when == "next":
            return start + timedelta(days=7), start + timedelta(days=13)
        return start, start + timedelta(days=6)
    if unit == "month":
        y, mo = today.year, today.month
        if when in ("last", "past"):
            y, mo = (y, mo - 1) if mo > 1 else (y - 1, 12)
        elif when == "next":
            y, mo = (y, mo + 1) if mo < 12 else (y + 1, 1)
        return date(y, mo, 1), date(y, mo, calendar.monthrange(y, mo)[1])
    y = today.year + {"last": -1, "past": -1, "next": 1}.get(when, 0)
    return date(y, 1, 1), date(y, 12, 31)


@dataclass
class Profile:
    question: str
    subject_speakers: list[str]  # speakers of the boundary named in the question
    entities: list[str]  # normalised names of the question's entities (NER + named speakers)
    entity_spans: list[tuple[int, int]]  # character spans of those names in the question
    keywords: list[str]  # stemmed content words
    answer_type: str
    interval: tuple[date, date] | None  # temporal validity window (absolute, else relative to as_of)
    relative: bool
    ordering: bool
    years: list[int] = field(default_factory=list)
    noun: str | None = None  # what a what/which question asks for

    @property
    def other_entities(self) -> list[str]:
        speakers = {normalize_entity(s) for s in self.subject_speakers}
        return [e for e in self.entities if e not in speakers]

    def as_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject_speakers, "entities": self.entities, "keywords": self.keywords, "answer_type": self.answer_type,
            "answer_noun": self.noun,
            "temporal": {"interval": [d.isoformat() for d in self.interval] if self.interval else None, "relative": self.relative,
                         "ordering": self.ordering, "years": self.years},
        }


def build_profile(question: str, speakers: list[str], mentions: list[tuple[str, str, int, int]], as_of: datetime | None) -> Profile:
    """`mentions`: NER mentions of the question (text, label, start, end)."""
    low = question.lower()
    subject = [s for s in speakers if re.search(r"\b" + re.escape(s.lower()) + r"\b", low)]
    names, spans = [], []
    for text, label, start, end in mentions:
        if label in VALUE_LABELS:
            continue
        n = normalize_entity(text)
        if n and n not in names:
            names.append(n)
            spans.append((start, end))
    for s in subject:
        n = normalize_entity(s)
        if n not in names:
            m = re.search(r"\b" + re.escape(s.lower()) + r"\b", low)
            names.append(n)
            spans.append((m.start(), m.end()))
    interval = absolute_interval(question)
    relative = bool(_RELATIVE.search(question))
    if interval is None and relative:
        interval = relative_interval(question, as_of)
    return Profile(
        question=question, subject_speakers=subject, entities=names, entity_spans=spans, keywords=keywords(question),
        answer_type=answer_type(question), interval=interval, relative=relative, ordering=bool(_ORDER.search(question)),
        years=[int(y) for y in _D_Y.findall(question)], noun=answer_noun(question),
    )
