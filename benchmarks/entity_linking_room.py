"""How much room the dev split leaves for entity linking beyond exact names (issue 18), counted.

    .venv/bin/python benchmarks/entity_linking_room.py --data-dir DIR

The issue lists aliases, first names, possessives and pronouns resolved to the speaker or the
last named person. Possessives are already merged by schemas/text.normalize_entity and every turn
already links to its speaker's node (the graph projection's speaker_as_entity), so "I" and "my"
are resolved. Before building the rest into the projection, this counts where each could change
a ranking: questions that name a speaker by a short form, first-name / full-name pairs among the
named persons, and gold turns that refer to a person the question names only by "he" or "she",
with that person named shortly before in the session. For each, the shipped method's recall on
the questions concerned says whether anything is left to gain. DIR is zeromem_variants.py's.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zeromem_variants import open_bank  # noqa: E402  (benchmarks/zeromem_variants.py)
from schemas.text import normalize_entity  # noqa: E402
from services.query.config import DEFAULT  # noqa: E402
from services.query.zeromem import ZeroMem  # noqa: E402

THIRD_PERSON = re.compile(r"\b(he|him|his|she|her|hers)\b", re.I)
CAPITALISED = re.compile(r"\b[A-Z][a-z]{2,}\b")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data/locomo/locomo-dev.json")
    ap.add_argument("--data-dir", required=True, help="ingested split, kept between runs (ingested on first use)")
    ap.add_argument("--antecedent-turns", type=int, default=3, help='how far back in the session "the last named person" is looked for')
    args = ap.parse_args()
    back = args.antecedent_turns
    bank, views, registry = open_bank(Path(args.data), Path(args.data_dir))
    extractor = registry.extractor()
    try:
        first_question = {c: int(np.flatnonzero(bank.conv_of == k)[0]) for k, c in enumerate(bank.conversations)}
        turns_of, persons_of = {}, {}
        for conv, i in first_question.items():
            ctx, refs = bank._context(i)
            corpus = ctx.corpus
            analyses = extractor.analyze([t.text for t in corpus.turns])
            persons = [{normalize_entity(m.text) for m in a.mentions if m.label == "PERSON"} for a in analyses]
            turns_of[conv] = (corpus, {r: p for p, r in enumerate(refs)}, persons)
            persons_of[conv] = Counter(p for found in persons for p in found)

        def recall(idx: list[int], budget: int) -> str:
            return f"{bank.zero_mem(DEFAULT, 'zero-mem', np.array(idx))[f'recall@{budget}'].mean():.3f}" if idx else "-"

        def in_top_25(i: int, ref: str) -> bool:
            ctx, refs = bank._context(i)
            return ref in {refs[p] for p in ZeroMem(ctx, DEFAULT).order("zero-mem")[:25].tolist()}

        # 1. speakers named by a short form ("Mel" for Melanie), in questions and in turns
        short_q, short_turns = [], 0
        for conv, (corpus, _, _) in turns_of.items():
            speakers = [normalize_entity(s) for s in corpus.speakers]
            def is_short(word: str) -> bool:
                w = word.lower()
                return any(s.split()[0].startswith(w) and s.split()[0] != w for s in speakers)
            short_turns += sum(any(is_short(w) for w in CAPITALISED.findall(t.text)) for t in corpus.turns)
            short_q += [i for i in np.flatnonzero(bank.conv_of == bank.conversations.index(conv)).tolist()
                        if any(is_short(w) for w in CAPITALISED.findall(bank.qs[i].question))]
        print(f"speaker short forms: {short_turns} turns, {len(short_q)} questions; "
              f"their recall@10 / @25 as shipped {recall(short_q, 10)} / {recall(short_q, 25)}")

        # 2. first names beside full names among the named persons of one conversation
        pairs = []
        for conv, names in persons_of.items():
            singles = {n for n in names if len(n.split()) == 1}
            pairs += [(conv, n.split()[0], n) for n in names if len(n.split()) > 1 and n.split()[0] in singles]
        print(f"named persons: {sum(len(n) for n in persons_of.values())} distinct over {len(persons_of)} conversations; "
              f"first name beside full name: {len(pairs)} {pairs[:10]}")

        # 3. "he"/"she" for a person the question names, named in the session shortly before
        pronoun_turns = sum(bool(THIRD_PERSON.search(t.text)) for corpus, _, _ in turns_of.values() for t in corpus.turns)
        gold_links = gold_pronoun = 0
        resolvable: list[tuple[int, str]] = []
        asked_of = extractor.analyze([q.question for q in bank.qs])
        for i, q in enumerate(bank.qs):
            corpus, pos, persons = turns_of[q.conversation]
            asked = {normalize_entity(m.text) for m in asked_of[i].mentions if m.label == "PERSON"}
            asked -= {normalize_entity(s) for s in corpus.speakers}
            for ref in bank.gold[i]:
                p = pos.get(ref)
                if p is None:
                    continue
                gold_links += 1
                if not THIRD_PERSON.search(corpus.turns[p].text):
                    continue
                gold_pronoun += 1
                before = [persons[k] for k in range(max(0, p - back), p) if corpus.session[k] == corpus.session[p]]
                if asked and not (asked & persons[p]) and any(asked & found for found in before):
                    resolvable.append((i, ref))
        missed = [(i, ref) for i, ref in resolvable if not in_top_25(i, ref)]
        print(f"third-person pronouns: {pronoun_turns} of {sum(c.n for c, _, _ in turns_of.values())} turns; in {gold_pronoun} of "
              f"{gold_links} gold links; resolvable to a person the question names (named in the {back} turns before, "
              f"not in the turn): {len(resolvable)} gold links, of which outside the shipped top 25: {len(missed)}")
        for i, ref in resolvable:
            print(f"  {bank.qs[i].conversation} {ref} {'missed' if (i, ref) in missed else 'found'}: {bank.qs[i].question}")
    finally:
        views.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
