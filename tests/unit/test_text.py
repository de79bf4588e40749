from __future__ import annotations

import pytest

from schemas.text import normalize_entity, split_sentences

pytestmark = pytest.mark.unit


def test_sentences_cover_the_text_and_respect_abbreviations():
    text = "I met Dr. Smith yesterday! He said hi. Then we left...  OK?"
    spans = split_sentences(text)
    assert [text[s:e] for s, e in spans] == ["I met Dr. Smith yesterday!", "He said hi.", "Then we left...", "OK?"]
    assert split_sentences("") == [] and split_sentences("no end") == [(0, 6)]


@pytest.mark.parametrize("raw,norm", [("Caroline's", "caroline"), ("  The  Beatles ", "beatles"), ("JAMES'", "james"),
                                       ("“Hamilton”", "hamilton"), ("Melanie’s", "melanie")])
def test_entity_names_are_normalised(raw, norm):
    assert normalize_entity(raw) == norm
