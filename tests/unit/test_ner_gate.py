"""The entity-cue gate (MEMSTREAM_NER_GATE=cues): which turns reach the NER model, and that the
others come back in place with their sentences and no mentions."""

from __future__ import annotations

import pytest

from infra.models.fast import LexiconExtractor
from infra.models.ner_gate import CueGatedExtractor, has_entity_cue
from infra.registry import Registry
from infra.settings import Settings


@pytest.mark.parametrize("text", [
    "We went to Paris together.",  # a capitalised word inside a sentence
    "It took 3 hours.",  # a digit
    "I finished it last week.",  # a calendar word
    "She has two dogs.",  # a number word
    "Wow. Thanks, Anna and Bob came too.",  # "Anna" is followed by "and": not an address
    "I met Jon.",  # a name after "I"
])
def test_turns_with_a_cue_reach_the_model(text):
    assert has_entity_cue(text)


@pytest.mark.parametrize("text", [
    "Thanks, that sounds great!",  # a capitalised word opening a sentence
    "Wow! That's so cool. I'm happy for you.",  # openers after sentence ends, "I" and its contractions
    "Thanks, Mel!",  # the addressee
    "Hey Caroline, how are you doing?",
    "That's great, Melanie. \"Keep going\" is my motto.",
    "",
])
def test_turns_without_one_do_not(text):
    assert not has_entity_cue(text)


class _Recording(LexiconExtractor):
    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def analyze(self, texts):
        self.seen += texts
        return super().analyze(texts)


def test_only_cued_turns_are_analysed_and_results_keep_their_order():
    inner = _Recording()
    gated = CueGatedExtractor(inner)
    texts = ["Thanks, Mel! Sounds fun.", "We drove to Boston.", "Great. See you soon!", "We got 2 cats from Anna."]
    out = gated.analyze(texts)
    assert inner.seen == ["We drove to Boston.", "We got 2 cats from Anna."]
    assert [[m.text for m in a.mentions] for a in out] == [[], ["Boston"], [], ["Anna"]]
    assert out[0].sentences == [(0, 12), (13, 24)]  # skipped turns still have their sentences
    assert gated.model_name == inner.model_name + "+cues"


def test_the_gate_is_on_by_default_and_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.delenv("MEMSTREAM_NER_GATE", raising=False)
    extractor = Registry(Settings.load(data_dir=tmp_path)).extractor()
    assert isinstance(extractor, CueGatedExtractor) and extractor.model_name.endswith("+cues")
    monkeypatch.setenv("MEMSTREAM_NER_GATE", "off")
    assert not isinstance(Registry(Settings.load(data_dir=tmp_path)).extractor(), CueGatedExtractor)
