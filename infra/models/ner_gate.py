"""The entity-cue gate: run the NER model only on turns that can hold an entity.

`MEMSTREAM_NER_GATE=cues`, the default (infra/settings.py; `off` runs the model on every turn).
Most conversational turns name nothing ("Thanks, that sounds great!"), yet the NER model costs the
same on each; at ingest it is the second model beside the encoder on the same two cores (docs/results/ingest.md). A turn goes to the model when it has an entity cue:

- a digit (dates, amounts, times);
- a number or calendar word from closed English word classes (`_NUMBER_WORDS`, `_CALENDAR_WORDS`:
  cardinal and ordinal number words, day / week / month / year words, parts of the day, seasons,
  "ago", "last", "next");
- a capitalised word that neither opens a sentence nor addresses someone ("Thanks, Mel!", "Hey
  Caroline,"), other than "I" and its contractions.

Other turns get their sentences and no mentions. In conversation a capitalised word opening a
sentence is mostly an interjection ("Wow", "Thanks", "Yeah"), and an addressed name is the other
speaker, a graph node anyway. On the dev split the model sees 831 of the 2,760 turns; of the 1,630
mentions it finds on all of them, 686 are lost: 572 a speaker's name, most of the rest
interjections it mislabels ("Congrats" as NORP, "Glad" as PERSON), about a dozen sentence-initial
names ("Barcelona is ..."). The recall cost and the rate: docs/results/ingest.md.

Stateless and per text, so a replay builds the same graph whatever its batches.
"""

from __future__ import annotations

import re

from schemas.ports.models import AnalyzedText
from schemas.text import split_sentences

_NUMBER_WORDS = (
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred hundreds thousand thousands "
    "million millions billion dozen dozens half couple once twice first second third fourth fifth sixth seventh "
    "eighth ninth tenth"
)
_CALENDAR_WORDS = (
    "today yesterday tomorrow tonight day days daily week weeks weekly weekend weekends month months monthly year "
    "years yearly annual annually decade decades century centuries hour hours minute minutes morning mornings "
    "afternoon evening evenings night nights noon midnight spring summer autumn fall winter ago last next recently "
    "lately birthday anniversary"
)
_CUE_WORDS = re.compile(r"\b(?:" + "|".join(sorted(set((_NUMBER_WORDS + " " + _CALENDAR_WORDS).split()), key=len, reverse=True)) + r")\b",
                        re.IGNORECASE)
_DIGIT = re.compile(r"\d")
_CAPITALISED = re.compile(r"\b[A-Z][\w'’-]*")
_SELF = re.compile(r"I(?:['’](?:m|ve|ll|d))?$")
_OPENERS = " \t\"'“‘([-*"  # what may stand between a sentence start and its first word
_SENTENCE_END = ".!?…\n"
_GREETING = re.compile(r"(?:hey|hi|hello|thanks|thank you|bye|dear|yo|congrats|congratulations)\W*$", re.IGNORECASE)
_AFTER_VOCATIVE = re.compile(r"[ \t]*(?:[,.!?…:;)]|$)")


def has_entity_cue(text: str) -> bool:
    """Whether the gate sends this text to the NER model (module docstring)."""
    if _DIGIT.search(text) or _CUE_WORDS.search(text):
        return True
    for m in _CAPITALISED.finditer(text):
        if _SELF.match(m.group(0)):
            continue
        head = m.start()
        while head > 0 and text[head - 1] in _OPENERS:
            head -= 1
        if head == 0 or text[head - 1] in _SENTENCE_END:
            continue  # opens a sentence
        if _AFTER_VOCATIVE.match(text, m.end()) and (text[head - 1] == "," or _GREETING.search(text, 0, head)):
            continue  # "Thanks, Mel!", "Hey Caroline," "That's great, Mel.": the addressee
        return True
    return False


def gated(extractor, gate: str):
    """`extractor` behind the gate the setting names (`MEMSTREAM_NER_GATE`): the registry and the
    tests' shared models wrap the loaded model the same way."""
    return CueGatedExtractor(extractor) if gate == "cues" else extractor


class CueGatedExtractor:
    """An EntityExtractor that runs `inner` only on the texts with an entity cue."""

    def __init__(self, inner):
        self.inner = inner

    @property
    def model_name(self) -> str:
        return f"{self.inner.model_name}+cues"

    @property
    def load_seconds(self) -> float:
        return getattr(self.inner, "load_seconds", 0.0)

    def start(self) -> None:
        self.inner.start()

    def label_glossary(self) -> dict[str, str]:
        return self.inner.label_glossary()

    def analyze(self, texts: list[str]) -> list[AnalyzedText]:
        cued = [i for i, t in enumerate(texts) if has_entity_cue(t)]
        found = dict(zip(cued, self.inner.analyze([texts[i] for i in cued]))) if cued else {}
        return [found.get(i) or AnalyzedText(sentences=split_sentences(t), mentions=[]) for i, t in enumerate(texts)]
