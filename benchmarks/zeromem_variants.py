"""In-sample screen of Zero-Mem design variants that are not constants of config.py (issue 18).

    .venv/bin/python benchmarks/zeromem_variants.py --data-dir DIR [--variants noun,closure,...]

Each variant changes one computation of services/query/zeromem.py (a subclass here, not in the
product) and is scored over a few settings on the 760 dev questions with the shipped constants, in
sample, beside the shipped method in the same process. It is a screen: a variant that does not
lift both budgets in-sample is not worth a held-out run; one that does goes into the product as
a constant in services/eval/loco.py's GRID and is judged by `memstream eval locomo --loco`.
docs/results/retrieval.md quotes this script's output. DIR keeps the ingested split between runs. The
hyponym variants (hyponym, hyplex, hypnoun) read WordNet's files: benchmarks/wordnet.py. The
phrase variant needs a store of its own with two-word phrase nodes: --phrase-nodes and another DIR.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from datetime import date, timedelta
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import wordnet  # noqa: E402  (benchmarks/wordnet.py)
from infra.registry import Registry  # noqa: E402
from infra.settings import Settings  # noqa: E402
from schemas.keyindex import KeyIndex  # noqa: E402
from schemas.text import content_words, normalize_entity, split_sentences  # noqa: E402
from schemas.units import entity_id, sentence_id, unit_key  # noqa: E402
from services.query.analysis import keyword_words, stem  # noqa: E402
from services.eval import loco  # noqa: E402
from services.eval.locomo import ingest, questions  # noqa: E402
from services.eval.metrics import CATEGORIES  # noqa: E402
from services.query import zeromem as zm  # noqa: E402
from services.query.answers import _REL, resolve_relative  # noqa: E402  (the answers' own relative-date rules)
from services.query.config import DEFAULT  # noqa: E402
from streams.sources import locomo  # noqa: E402

SETTING: dict = {}  # the variant's current setting, read by the subclass below
_WORD_VECTORS: dict[str, np.ndarray] = {}


def _word_vectors(encoder, words: list[str]) -> np.ndarray:
    missing = sorted({w for w in words if w not in _WORD_VECTORS})
    for w, v in zip(missing, encoder.encode(missing) if missing else []):
        _WORD_VECTORS[w] = v / (np.linalg.norm(v) or 1.0)
    return np.stack([_WORD_VECTORS[w] for w in words]) if words else np.zeros((0, 1))


def _derived(corpus, name: str, compute):
    """What a variant derives from one corpus, computed once and kept on it (corpus.derived, as the
    baselines keep theirs)."""
    key = "screen:" + name
    if key not in corpus.derived:
        corpus.derived[key] = compute()
    return corpus.derived[key]


def _speaker_words(corpus) -> set[str]:
    """The words of the boundary's speakers' names, which keyword nodes leave out."""
    return _derived(corpus, "speaker words", lambda: {w for sp_ in corpus.speakers for w in normalize_entity(sp_).split()})


def _sentence_owners(corpus) -> tuple[KeyIndex, np.ndarray]:
    """The corpus's sentences (as the dense view keys them) and the turn position of each."""
    def compute():
        keys, owner = [], []
        for i, t in enumerate(corpus.turns):
            for j in range(len(split_sentences(t.text))):
                keys.append(unit_key(sentence_id(t.unit_id, j)))
                owner.append(i)
        return KeyIndex(keys), np.array(owner, dtype=np.int64)

    return _derived(corpus, "sentence owners", compute)


class Variant(zm.ZeroMem):
    """The shipped method plus every variant's hook; SETTING selects one (empty: the shipped method)."""

    def _extra(self, name: str, compute):
        key = ("variant", name, tuple(sorted((k, str(v)) for k, v in SETTING.items())), repr(self.cfg))
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    # kwvec: keyword nodes aligned by the cosine of their words' vectors to the question's words
    # ("martial arts" -> kickboxing), not only by exact stem; the vectors are computed here for
    # the screen (the product would store them with the nodes at ingest)
    @property
    def activations(self):
        eta = self._memo("activations", ("question_entities", "align_min", "keyword_activation"), self._activations)
        if "hyponym" in SETTING:
            return self._extra("hyponym", lambda: self._member_keywords(eta))
        if "phrase" in SETTING:
            return self._extra("phrase", lambda: self._phrase_keywords(eta))
        if "kwvec" not in SETTING:
            return eta
        return self._extra("kwvec", lambda: self._semantic_keywords(eta))

    # hyponym: keyword nodes of the members of a category word of the question, from WordNet's
    # noun hierarchy ("martial arts" -> judo, karate, taekwondo); a phrase whose members present in
    # the boundary exceed `cap` is too broad ("activities") and adds nothing
    def _member_keywords(self, eta: dict) -> dict:
        senses, depth, weight, cap = SETTING["hyponym"]
        out = dict(eta)
        for e in self._members(senses, depth, cap)[0]:
            out[e] = max(out.get(e, 0.0), weight * self.cfg.keyword_activation)
        return out

    # phrase: two-word noun phrases as graph nodes ("support group", "pottery class"): needs a
    # store ingested with --phrase-nodes; the question's adjacent keyword pairs present in the
    # boundary are activated at `weight` times a keyword's activation
    def _phrase_keywords(self, eta: dict) -> dict:
        b, out = self.ctx.boundary, dict(eta)
        speakers = _speaker_words(self.corpus)
        ids = [entity_id(b.tenant_id, "kw:" + st) for _, st in phrase_occurrences(self.profile.question, [], speakers)]
        for e in sorted(self.ctx.store("graph").present(b, ids)) if ids else []:
            out[e] = max(out.get(e, 0.0), SETTING["phrase"] * self.cfg.keyword_activation)
        return out

    def _members(self, senses: int, depth: int, cap: int) -> tuple[list[str], list[str]]:
        """(keyword node ids, their words) of the members of the question's category phrases."""
        h, b = wordnet.nouns(), self.ctx.boundary
        speakers = _speaker_words(self.corpus)
        source = (self.profile.noun or "") if SETTING.get("noun-only") else self.profile.question  # only the asked-for noun's words
        words = [w for w in keyword_words(source) if w not in speakers and not w.isdigit() and len(w) > 2]
        ids_out, words_out, used = [], [], set()
        for phrase in wordnet.phrases(words):
            parts = phrase.split("_")
            lemma = h.lemma(phrase)
            if lemma is None or used & set(parts):
                continue
            used.update(parts)
            members = h.members(lemma, senses, depth)
            by_id = {entity_id(b.tenant_id, "kw:" + s): w for s, w in zip(stem(members), members) if len(s) > 2}
            present = sorted(self.ctx.store("graph").present(b, list(by_id))) if by_id else []
            if 0 < len(present) <= cap:
                ids_out += present
                words_out += [by_id[e] for e in present]
        return ids_out, words_out

    def _member_bm25(self) -> np.ndarray:
        n, d, _, cap = SETTING["hyplex"]
        words = self._members(n, d, cap)[1]
        if not words:
            return np.zeros(self.n)
        keys, scores = self.ctx.store("lexical").score_units("turn", " ".join(words), self.ctx.boundary, self.corpus.n)
        return zm.mm(self.corpus.keys.scatter(keys, scores, fill=0.0))

    def _keyword_table(self):
        """(the corpus's keyword node ids, their commonest surface words' unit vectors)."""
        def compute():
            seen: dict[str, dict[str, int]] = {}
            for t in self.corpus.turns:
                for _, _, word, st in content_words(t.text):
                    if len(st) > 2 and not word.isdigit():
                        seen.setdefault(st, {}).setdefault(word, 0)
                        seen[st][word] += 1
            b = self.ctx.boundary
            ids = {entity_id(b.tenant_id, "kw:" + st): max(words, key=lambda w: (words[w], w)) for st, words in seen.items()}
            present = sorted(self.ctx.store("graph").present(b, list(ids)))
            return present, _word_vectors(self.ctx.encoder, [ids[i] for i in present])

        return _derived(self.corpus, "keyword table", compute)

    def _semantic_keywords(self, eta: dict) -> dict:
        tau, top, weight, *only_noun = SETTING["kwvec"]
        ids, vecs = self._keyword_table()
        speakers = _speaker_words(self.corpus)
        source = (self.profile.noun or "") if only_noun else self.profile.question  # only the asked-for noun's words
        words = [w for w in keyword_words(source) if w not in speakers and not w.isdigit() and len(w) > 2]
        out = dict(eta)
        if not words or not ids:
            return out
        sims = _word_vectors(self.ctx.encoder, words) @ vecs.T
        for row in sims:
            for j in np.argsort(-row, kind="stable")[:top]:
                if row[j] < tau:
                    break
                out[ids[j]] = max(out.get(ids[j], 0.0), weight * float(row[j]))
        return out

    # noun: the asked-for noun's own vector as a second dense query over turns
    # sentence: each turn's best sentence cosine added to the hierarchy view
    @property
    def hierarchy(self):
        base = self._memo("hierarchy", self.HIERARCHY_FIELDS, self._hierarchy)
        if "noun" in SETTING and self.profile.noun is not None:
            vec = np.asarray(zm._word_vector(self.ctx.encoder, self.profile.noun), dtype=np.float32)
            return base + SETTING["noun"] * self._extra("noun", lambda: zm.mm(self.ctx.dense("turn", None, vec)))
        if "sentence" in SETTING:
            return base + SETTING["sentence"] * self._extra("sentence", self._sentence_max)
        if "session" in SETTING:
            return base + SETTING["session"][0] * self._extra("session", self._session_level)
        if "hyplex" in SETTING:
            return base + SETTING["hyplex"][2] * self._extra("hyplex", self._member_bm25)
        return base

    # session: a session-level unit scored from its turns (mean, or mean of its best 3) and lifted
    # to every turn of the session, like the window and episode levels
    def _session_level(self) -> np.ndarray:
        how = SETTING["session"][1]
        a = self.cfg.a_lex
        rel = a * zm.mm(self.ctx.bm25("turn")) + (1 - a) * self._dense("turn")
        session = self.corpus.session
        out = np.zeros(self.n)
        for s_ in np.unique(session):
            members = np.flatnonzero(session == s_)
            vals = np.sort(rel[members])[::-1]
            out[members] = vals.mean() if how == "mean" else vals[:3].mean()
        return zm.mm(out)

    def _sentence_max(self) -> np.ndarray:
        keys, owner = _sentence_owners(self.corpus)
        out = np.full(self.n, -1.0)
        np.maximum.at(out, owner, self.ctx.sentence_relevance(keys))
        return zm.mm(out)

    # reldate: a turn's relative time phrases ("last week", "two days ago") resolved against the
    # day it was said (services/query/answers.resolve_relative), as if normalised at ingest; the
    # temporal compatibility takes the better of the turn's day and the days it speaks of
    @property
    def compat(self):
        base = self._memo("compat", ("time_tau_days",), self._compat)
        if "reldate" not in SETTING or self.profile.interval is None:
            return base
        return self._extra("reldate", lambda: self._event_compat(base))

    def _event_compat(self, base):
        subj, atype, tcomp = base
        lo, hi = (d.toordinal() for d in self.profile.interval)
        days = _event_days(self.corpus)
        out = tcomp.copy()
        for i, found in days.items():
            gap = min(max(lo - d, d - hi, 0) for d in found)
            out[i] = max(out[i], SETTING["reldate"] * max(0.0, 1.0 - gap / self.cfg.time_tau_days))
        return subj, atype, out

    # recent: for a question about the current state ("currently", "still", "recently", ...), the
    # later of conflicting turns preferred: a bonus growing with the turn's day in the boundary
    def scores(self, mode: str = "zero-mem"):
        fused, bonus, score = super().scores(mode)
        if "recent" not in SETTING or not _CURRENT.search(self.profile.question):
            return fused, bonus, score
        day = zm._turn_arrays(self.corpus).day.astype(float)
        return fused, bonus, score + SETTING["recent"] * zm.mm(day)

    # diverse: the evidence order re-ranked greedily so that a turn loses `penalty` for each turn
    # already chosen from its session ("session") or within 2 turns of it ("near"), or by its
    # best cosine to them ("mmr"); for every question or only those asking for a list
    def order(self, mode: str = "zero-mem"):
        if "diverse" not in SETTING:
            return super().order(mode)
        score = self.scores(mode)[2]
        base = zm._order(score)
        penalty, unit, scope, pool = SETTING["diverse"]
        if scope == "list" and self.profile.answer_type != "list":
            return base
        return self._extra("diverse", lambda: self._diverse(score, base, penalty, unit, pool))

    def _diverse(self, score: np.ndarray, base: np.ndarray, penalty: float, unit: str, pool: int) -> np.ndarray:
        head = base[:pool].tolist()
        session = self.corpus.session
        if unit == "mmr":
            ids = [self.corpus.turns[i].unit_id for i in head]
            got = self.ctx.store("dense").vectors("turn", self.ctx.boundary.tenant_id, ids)
            vec = np.stack([np.asarray(got[t], dtype=float) for t in ids])
            vec /= np.linalg.norm(vec, axis=1, keepdims=True) + 1e-12
            sims = vec @ vec.T
        chosen: list[int] = []
        left = list(range(len(head)))
        while left:
            def value(j: int) -> float:
                i = head[j]
                if not chosen:
                    return float(score[i])
                if unit == "session":
                    hits = sum(session[head[c]] == session[i] for c in chosen)
                elif unit == "near":
                    hits = sum(session[head[c]] == session[i] and abs(head[c] - i) <= 2 for c in chosen)
                else:
                    hits = max(float(sims[j, c]) for c in chosen)
                return float(score[i]) - penalty * hits
            best = max(left, key=lambda j: (value(j), -j))
            chosen.append(best)
            left.remove(best)
        return np.concatenate([np.array([head[j] for j in chosen], dtype=base.dtype), base[pool:]])

    # prior: the walk's context priors from the hierarchy view instead of the dense one
    # twohop: multi-hop as two-step retrieval: the entities of the first hop's top turns (the
    # fused ranking of the shipped walk and the hierarchy view; "ner": named ones only, "all":
    # keyword nodes too) join the question's activations in a second walk, which replaces the first
    @property
    def graph_scores(self):
        if "kwvec" in SETTING or "hyponym" in SETTING or "phrase" in SETTING:  # other activations: the shipped memo (keyed on constants) does not apply
            return self._extra("walk of other activations", self._graph_scores)
        if "twohop" in SETTING:
            return self._extra("twohop", self._two_hop_walk)
        if "prior" not in SETTING:
            return super().graph_scores
        return self._extra("prior", self._hierarchy_prior_walk)

    def _two_hop_walk(self):
        top_m, weight, kinds, how = SETTING["twohop"]
        first = super().graph_scores
        if first is None:
            return None
        cfg, b = self.cfg, self.ctx.boundary
        hop1 = cfg.rho * zm.mm(self.hierarchy) + (1 - cfg.rho) * zm.mm(zm.mm(first) + cfg.g_lexical * self.lexcov)
        top = zm._order(hop1)[:top_m].tolist()
        ids = zm._turn_arrays(self.corpus).ids
        graph = self.ctx.store("graph")
        ents, ner, df = _entity_table(self.corpus, graph, b)
        speakers = {entity_id(b.tenant_id, normalize_entity(s_)) for s_ in self.corpus.speakers}
        eta = dict(self.activations)
        gained: dict[str, float] = {}
        for i in top:
            for e in ents.get(ids[i], ()):
                if e in speakers or e in eta or (kinds == "ner" and e not in ner):
                    continue
                g = 1.0 if how == "flat" else float(hop1[i]) * np.log(self.n / df[e])
                gained[e] = gained.get(e, 0.0) + g
        if not gained:
            return first
        best = max(gained.values())
        for e, g in gained.items():
            eta[e] = weight * cfg.keyword_activation * g / best
        return self._walk(eta)

    def _hierarchy_prior_walk(self):
        return self._walk(self.activations, self.hierarchy)

    # degree: PPR divided by context degree^d; transform: PPR fused by another normalisation;
    # focus: query-relevant sentences that mention activated entities, as a graph-view term
    @property
    def graph(self):
        s = self.graph_scores
        if s is None:
            return zm.mm(self.ctx.dense("turn"))
        if "degree" in SETTING:
            s = s / self._extra("degree", self._degree) ** SETTING["degree"]
        g = _transform(s, SETTING.get("transform", "minmax")) + self.cfg.g_lexical * self.lexcov
        if "focus" in SETTING:
            g = g + SETTING["focus"] * self._extra("focus", self._focus)
        return g

    def _degree(self) -> np.ndarray:
        mentions = self.ctx.store("graph").context_mentions(self.ctx.boundary)
        return np.array([len(mentions.get(t, ())) + 2.0 for t in zm._turn_arrays(self.corpus).ids])

    def _focus(self) -> np.ndarray:
        out = np.zeros(self.n)
        inc = self.ctx.store("graph").sentence_incidence(self.ctx.boundary)
        if self.activations and inc.sentence_ids:
            w = np.maximum(self.ctx.sentence_relevance(inc.keys), 0.0)
            ids, act = self._propagate(self.activations)
            a = np.zeros(len(inc.entity_ids))
            for e, v in zip(ids, act.tolist()):
                if e in inc.entity_index:
                    a[inc.entity_index[e]] = v
            s = w * ((inc.matrix @ a) > 0)
            pos = {t: i for i, t in enumerate(zm._turn_arrays(self.corpus).ids)}
            owner = np.array([pos.get(c, -1) for c in inc.context_ids])
            np.maximum.at(out, owner[owner >= 0], s[owner >= 0])
        return zm.mm(out)


def phrase_occurrences(text: str, skip: list[tuple[int, int]], speaker_words: set[str]) -> list[tuple[int, str]]:
    """(start, "stem_stem") of each two adjacent content words (nothing but spaces between them),
    both keyword-node words: 3+ character stems, not numbers, not a speaker's name, not inside an
    entity mention. As the projection would add them beside the single-word keyword nodes."""
    found = [(a, b, w, st) for a, b, w, st in content_words(text)
             if len(st) > 2 and not w.isdigit() and w not in speaker_words and not any(x <= a < y for x, y in skip)]
    return [(a1, f"{s1}_{s2}") for (a1, b1, _, s1), (a2, _, _, s2) in zip(found, found[1:]) if not text[b1:a2].strip()]


def _with_phrase_nodes() -> None:
    """Ingest with two-word phrase nodes: the graph projection's keyword occurrences gain each
    turn's adjacent content-word pairs (only this process, for a store of its own)."""
    from streams.projections import graph as projection

    single = projection.keyword_occurrences

    def both(text: str, skip: list[tuple[int, int]], speaker: str) -> list[tuple[int, str]]:
        return single(text, skip, speaker) + phrase_occurrences(text, skip, set(normalize_entity(speaker).split()))

    projection.keyword_occurrences = both


_CURRENT = re.compile(r"\b(currently|current|now|still|latest|recently|most recent|these days|anymore)\b", re.I)


def _event_days(corpus) -> dict[int, list[int]]:
    """Per turn position: the days (ordinals) its relative time phrases speak of.
    A week or weekday before: 4 days back; a month: its 15th; a year: July 1st."""
    def compute():
        out: dict[int, list[int]] = {}
        for i, t in enumerate(corpus.turns):
            said = corpus.occurred[i].date()
            for m in _REL.finditer(t.text):
                r = resolve_relative(m.group(1), said)
                if r is None:
                    continue
                v = r[1]
                if isinstance(v, date):
                    d = v
                elif isinstance(v, int):
                    d = date(v, 7, 1)
                elif isinstance(v, tuple) and len(v) == 2:
                    d = date(v[0], v[1], 15)
                elif isinstance(v, tuple) and v[0] == "before":
                    d = said - timedelta(days=4)
                else:
                    d = said + timedelta(days=4)
                out.setdefault(i, []).append(d.toordinal())
        return out

    return _derived(corpus, "event days", compute)


def _entity_table(corpus, graph, boundary):
    """Per turn id its graph entities (NER, speakers, keyword nodes); the named (NER) ones; each entity's
    number of turns."""
    def compute():
        ids = zm._turn_arrays(corpus).ids
        ents = graph.context_entities(boundary.tenant_id, ids)
        ner = {e for found in graph.context_mentions(boundary).values() for e, label in found if label not in ("KEYWORD", "SPEAKER")}
        df: dict[str, int] = {}
        for found in ents.values():
            for e in found:
                df[e] = df.get(e, 0) + 1
        return ents, ner, df

    return _derived(corpus, "entity table", compute)


def _transform(s: np.ndarray, how: str) -> np.ndarray:
    if how == "minmax":
        return zm.mm(s)
    if how.startswith("pow"):
        return zm.mm(np.power(np.maximum(s, 0.0), float(how[3:])))
    if how == "log":
        return zm.mm(np.log(np.maximum(s, 0.0) + 1e-6))
    if how == "rank":
        r = np.empty(len(s))
        r[np.argsort(-s, kind="stable")] = np.arange(len(s))
        return 1.0 / (1.0 + r / 10.0)
    if how == "z":
        return zm.mm(np.clip((s - s.mean()) / (s.std() + 1e-12), -3, 3))
    raise ValueError(how)


RETUNED_HIERARCHY = dict(a_lex=0.5, w_turn=1.0, w_windows=(1.0, 1.0))  # what hierarchy-only picks in every LOCO fold

# variant -> [(label, SETTING, config changes, mode)]
VARIANTS: dict[str, list] = {
    "kwvec": [(f"kwvec tau {t} top {k} weight {w}", {"kwvec": (t, k, w)}, {}, "zero-mem")
              for t in (0.6, 0.7, 0.8) for k in (3, 10) for w in (0.5, 1.0)]
             + [(f"kwvec asked-for noun only tau {t} top {k} weight {w}", {"kwvec": (t, k, w, "noun")}, {}, "zero-mem")
                for t in (0.55, 0.6) for k in (3, 10) for w in (0.5, 1.0)]
             + [(f"kwvec tau {t} top {k} weight {w} (graph-only)", {"kwvec": (t, k, w)}, {}, "graph-only")
                for t in (0.7,) for k in (3, 10) for w in (0.5, 1.0)],
    "hyponym": [(f"hyponym senses {n} depth {d} weight {w} cap {c} ({mode})", {"hyponym": (n, d, w, c)}, {}, mode)
                for mode in ("zero-mem",) for n in (1, 2) for d in (1, 2, 3) for w in (0.5, 1.0) for c in (5, 20)]
               + [(f"hyponym senses 1 depth 2 weight {w} cap 20 (graph-only)", {"hyponym": (1, 2, w, 20)}, {}, "graph-only") for w in (0.5, 1.0)],
    "hyplex": [(f"hyponym BM25 senses {n} depth {d} weight {w} cap {c} ({mode})", {"hyplex": (n, d, w, c)}, {}, mode)
               for mode in ("zero-mem",) for n in (1, 2) for d in (1, 2) for w in (0.1, 0.2, 0.4) for c in (5, 20)],
    "hypnoun": [(f"hyponym of the asked-for noun senses {n} depth {d} weight {w} cap {c} ({'graph' if g else 'BM25'})",
                 {("hyponym" if g else "hyplex"): (n, d, w, c), "noun-only": 1}, {}, "zero-mem")
                for g in (True, False) for n in (1, 2) for d in (1, 2, 3) for w in ((0.5, 1.0) if g else (0.2, 0.4)) for c in (20, 100)],
    "session": [(f"session {how} {w} ({mode})", {"session": (w, how)}, {}, mode) for mode in ("zero-mem", "hierarchy-only")
                for how in ("mean", "top3") for w in (0.1, 0.25, 0.5)],
    "noun": [(f"noun {w}", {"noun": w}, {}, "zero-mem") for w in (0.1, 0.2, 0.3, 0.5, 0.8)],
    "closure": [(f"closure top {t} bridges {g} bonus {b}", {}, dict(closure_top=t, closure_graph=g, closure_bonus=b), "zero-mem")
                for t in (2, 3, 5) for g in (3, 5, 10) for b in (0.05, 0.1)]
               + [(f"closure neighbours 1 bonus {b}", {}, dict(closure_neighbours=1, neighbour_bonus=b), "zero-mem") for b in (0.02, 0.05)],
    "sentence": [(f"sentence {w} ({mode})", {"sentence": w}, {}, mode) for mode in ("zero-mem", "hierarchy-only")
                 for w in (0.1, 0.2, 0.4, 0.7, 1.0)],
    "reldate": [(f"relative dates resolved, weight {w}", {"reldate": w}, {}, "zero-mem") for w in (0.5, 1.0)]
               + [(f"relative dates resolved, weight 1.0, c_time {c}", {"reldate": 1.0}, {"c_time": c}, "zero-mem") for c in (0.2, 0.6)],
    "recent": [(f"recent {w}", {"recent": w}, {}, "zero-mem") for w in (0.05, 0.1, 0.2, 0.4)],
    "diverse": [(f"diverse {unit} penalty {p} ({scope}, pool {pool})", {"diverse": (p, unit, scope, pool)}, {}, "zero-mem")
                for unit in ("session", "near", "mmr") for scope in ("all", "list") for pool in (40,)
                for p in ((0.1, 0.2, 0.4) if unit == "mmr" else (0.02, 0.05, 0.1, 0.2))],
    "twohop": [(f"two-hop top {m} weight {w} {kinds} {how} ({mode})", {"twohop": (m, w, kinds, how)}, {}, mode)
               for mode in ("zero-mem",) for kinds in ("ner", "all") for how in ("flat", "idf") for m in (3, 5, 10) for w in (0.3, 0.6, 1.0)]
              + [(f"two-hop top 5 weight {w} all idf (graph-only)", {"twohop": (5, w, "all", "idf")}, {}, "graph-only") for w in (0.3, 1.0)],
    "phrase": [(f"phrase nodes weight {w} ({mode})", {"phrase": w}, {}, mode) for mode in ("zero-mem", "graph-only")
               for w in (0.5, 1.0, 1.5, 2.0, 3.0)],
    "degree": [(f"degree^{d}", {"degree": d}, {}, "zero-mem") for d in (0.25, 0.5, 0.75, 1.0)],
    "prior": [(f"hierarchy prior beta {b} top {t} rho {r}", {"prior": 1}, dict(beta_entities=b, prior_top=t, rho=r), "zero-mem")
              for b in (0.9, 0.8, 0.65, 0.5, 0.3) for t in (10, 20) for r in (0.6, 0.5)],
    "focus": [(f"focus {w}", {"focus": w}, {}, "zero-mem") for w in (0.25, 0.5, 1.0, 2.0)],
    "transform": [(f"{how} rho {r}{' retuned hierarchy' if h else ''}", {"transform": how}, dict(rho=r, **(RETUNED_HIERARCHY if h else {})), "zero-mem")
                  for how in ("minmax", "pow0.5", "pow0.25", "log", "rank", "z") for r in (0.5, 0.6, 0.7, 0.8) for h in (False, True)],
    "constants": [(f"{k}={v}", {}, {k: v}, "zero-mem") for k, vals in {
        "propagation_steps": [0, 2], "propagation_weight": [0.5, 2.0], "keyword_activation": [0.5, 2.0], "align_min": [0.3, 0.7],
        "prior_top": [5, 50], "prf_k": [5], "prf_alpha": [1.0]}.items() for v in vals],
}


def open_bank(data: Path, data_dir: Path, phrase_nodes: bool = False):
    """(QuestionBank over the dev questions, its LiveViews to close, the registry); the split is
    ingested into data_dir on first use and kept for later runs. `phrase_nodes`: the store has
    two-word phrase nodes too (a store of its own: the marker file says which kind it holds)."""
    from services.query.service import QueryService
    from services.views import LiveViews

    samples = locomo.load(data)
    settings = Settings().model_copy(update={"data_dir": data_dir})
    registry = Registry(settings)
    marker, kind = data_dir / ".ingested", "phrase-nodes" if phrase_nodes else ""
    if marker.exists() and marker.read_text().strip() != kind:
        raise SystemExit(f"{data_dir} holds a store ingested {'with' if not kind else 'without'} --phrase-nodes; use another --data-dir")
    if not marker.exists():
        if phrase_nodes:
            _with_phrase_nodes()
        data_dir.mkdir(parents=True, exist_ok=True)
        print(asyncio.run(ingest(settings, registry, samples, "locomo", None)), flush=True)
        marker.write_text(kind)
    views = LiveViews(registry)
    service = QueryService(views, registry.encoder(), registry.extractor())
    service.start()
    return loco.QuestionBank(service, views, questions(samples, None), "locomo"), views, registry


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data/locomo/locomo-dev.json")
    ap.add_argument("--data-dir", required=True, help="ingested split, kept between runs (ingested on first use)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated of {', '.join(VARIANTS)}")
    ap.add_argument("--phrase-nodes", action="store_true", help="the store has two-word phrase nodes (ingested so on first use; the phrase variant needs it)")
    args = ap.parse_args()
    wanted = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(wanted) - set(VARIANTS))
    if unknown:
        ap.error(f"unknown variants {unknown}")
    if "phrase" in wanted and not args.phrase_nodes:
        ap.error("the phrase variant needs a store with phrase nodes: --phrase-nodes (and a --data-dir of its own)")
    loco.ZeroMem = Variant  # the bank scores through the variant class
    bank, views, _ = open_bank(Path(args.data), Path(args.data_dir), args.phrase_nodes)
    try:
        every = np.arange(len(bank.qs))

        def show(label: str, setting: dict, changes: dict, mode: str) -> None:
            SETTING.clear()
            SETTING.update(setting)
            r = bank.zero_mem(DEFAULT.with_(**changes), mode, every)
            cells = " | ".join(f"{name} {r['recall@10'][bank.category == c].mean():.3f}/{r['recall@25'][bank.category == c].mean():.3f}"
                               for c, name in CATEGORIES.items())
            print(f"{label}: all {r['recall@10'].mean():.4f} / {r['recall@25'].mean():.4f} | {cells}", flush=True)

        show("shipped", {}, {}, "zero-mem")
        show("shipped (hierarchy-only)", {}, {}, "hierarchy-only")
        for name in wanted:
            for row in VARIANTS[name]:
                show(*row)
    finally:
        views.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
