"""Zero-Mem retrieval (paper: Method), stage by stage, with zero LLM calls.

profile φ(q) (eq. 6) -> route (eq. 7) -> hierarchy view (eq. 11) and graph view (eq. 8-10),
both always run -> per-view min-max fusion, ρ·primary + (1-ρ)·secondary (eq. 12-13) ->
M(q) = top-k -> closure: graph bridges seeded on the top of M(q) (eq. 14) -> calibration: hard
filters, then subject / answer-type / temporal compatibility (eq. 15).

Decisions the paper leaves open are ours, each measured on the LoCoMo dev split (docs/results/retrieval.md); every constant is in config.py. In particular:
- evidence is every admissible turn of the boundary, ranked by the calibrated score: the top-k
  fused candidates are M(q) (role "primary"), closure additions are "bridge", and the rest fill
  the turn budget ("fill"); so the evidence budget, not k, decides how much is returned;
- the hard filter is the boundary (tenant, conversation, session, agent, time range), which
  the stores enforce on every read, so nothing outside it can reach calibration;
- routing: with the tuned weights the hierarchy view is primary for every question form
  (`route="local"`); the rule-based router of eq. 7 is available (`route="rules"`) and measured.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import compress, repeat
from typing import Callable, Mapping

import numpy as np
import scipy.sparse as sp

from schemas.errors import ViewUnavailable
from schemas.versioned_cache import Lru
from schemas.text import normalize_entity
from schemas.units import entity_id
from services.query.analysis import keyword_words, stem, stop_words, tokens
from services.query.config import DEFAULT, ZeroMemConfig
from services.query.context import Candidate, QueryContext, Ranking
from services.query.profile import MONTHS, WEEKDAYS, Profile, build_profile

MODES = ("zero-mem", "graph-only", "hierarchy-only", "no-closure", "no-calibration")

# Generic temporal and numeric expressions (calendar words and number words, not derived from
# any evaluation question): evidence that a turn can answer "when" or "how many".
_TIME_RE = re.compile(
    r"\b(yesterday|today|tonight|tomorrow|ago|last (week|weekend|month|year|night|time|summer|winter|spring|fall|"
    + "|".join(WEEKDAYS) + r")|next (week|weekend|month|year)|this (week|weekend|month|year|morning|evening)|"
    r"recently|earlier|(few|couple of) (days|weeks|months|years)|since|" + "|".join(MONTHS + WEEKDAYS) + r"|\d{4})\b", re.I)
_NUM_RE = re.compile(r"\b(\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|hundred|thousand|once|"
                     r"twice|several|a few|couple)\b", re.I)
_PLACE_LABELS = {"GPE", "LOC", "FAC"}
_DATE_LABELS = {"DATE", "TIME"}
_NUMBER_LABELS = {"CARDINAL", "QUANTITY", "MONEY", "PERCENT"}


def mm(x: np.ndarray) -> np.ndarray:
    """Min-max normalisation over the candidates of one view (eq. 12): flat -> 1."""
    if x.size == 0:
        return x
    lo, hi = float(np.min(x)), float(np.max(x))
    if hi - lo < 1e-12:
        return np.ones_like(x, dtype=float)
    return (x - lo) / (hi - lo)


_WORDS_RE = re.compile(r"[A-Za-z0-9][\w'’&.-]*")
_CAPITALISED = re.compile(r"\b([A-Z][\w'’&.-]*(?:\s+[A-Z][\w'’&.-]*)*)")


def lexicon_mentions(question: str, tenant_id: str, labels: Mapping[str, str] | Callable[[list[str]], Mapping[str, str]],
                     max_words: int = 4) -> list[tuple[str, str, int, int]]:
    """Entity mentions of a question without a model, written to find what an English NER model
    finds: the longest capitalised word n-grams (not the question's first word alone) that are
    names the boundary already knows (`labels`: entity id -> label; a name is known when the id
    of its normalised form is there), with their label; then the remaining capitalised phrases
    as names to align by embedding. Month and weekday names are dates (NER's DATE), not names."""
    words = [(m.start(), m.end()) for m in _WORDS_RE.finditer(question)]
    if callable(labels):  # a store lookup: every n-gram's id asked at once
        grams = {entity_id(tenant_id, normalize_entity(question[words[i][0]:words[i + n - 1][1]]))
                 for n in range(max_words, 0, -1) for i in range(len(words) - n + 1)
                 if question[words[i][0]].isupper()}
        labels = labels(sorted(grams))
    taken = [False] * len(words)
    found = []
    for n in range(max_words, 0, -1):
        for i in range(len(words) - n + 1):
            if any(taken[i:i + n]):
                continue
            s, e = words[i][0], words[i + n - 1][1]
            text = question[s:e]
            if not text[0].isupper() or (i == 0 and n == 1):
                continue
            name = normalize_entity(text)
            label = labels.get(entity_id(tenant_id, name))
            if label is not None and name not in stop_words() and name not in _CALENDAR:
                found.append((text, label, s, e))
                taken[i:i + n] = [True] * n
    for m in _CAPITALISED.finditer(question):
        if m.start() == 0 or any(a < m.end() and m.start() < b for _, _, a, b in found) or m.group(1).lower() in _CALENDAR:
            continue
        found.append((m.group(1), "UNKNOWN", m.start(), m.end()))
    return sorted(found, key=lambda x: x[2])


_CALENDAR = frozenset(MONTHS + WEEKDAYS)


def route_rules(p: Profile) -> str:
    """Eq. 7: relational (graph primary) when the question hangs on named anchors or needs
    aggregation; local (hierarchy primary) for temporal questions and everything else."""
    if p.answer_type in ("date", "duration"):
        return "local"
    if p.other_entities or len(p.subject_speakers) >= 2 or p.answer_type in ("list", "number"):
        return "relational"
    return "local"


@dataclass
class _Turns:
    """Per-turn arrays the query side derives from a corpus (cached on the corpus)."""

    ids: list[str]  # turn ids in corpus order
    stems: list[set[str]]
    info: np.ndarray
    vocabulary: dict[str, int]  # stem -> column of `has_stem`
    has_stem: sp.csr_matrix  # turns x stems, 0/1
    speaker: np.ndarray  # per turn: its speaker's position in corpus.speakers
    day: np.ndarray  # per turn: the day it occurred (ordinal)


# What the method derives from one turn's text alone, kept by turn id (a turn's text never
# changes): the bounded path meets the same turns in question after question.
_BY_TURN = Lru(200_000)


def _turn_words(turns) -> list[tuple[int, frozenset[str]]]:
    """Per turn: its word count and its stems (of 'speaker: text')."""
    found, missing = _BY_TURN.get_many([("words", t.unit_id) for t in turns])
    if missing:
        made = {}
        for t in turns:
            if ("words", t.unit_id) in found:
                continue
            text = f"{t.provenance.speakers[0]}: {t.text}"
            made[("words", t.unit_id)] = (max(len(text.split()), 1), frozenset(tokens(text)))
        _BY_TURN.put_many(made)
        found.update(made)
    return [found[("words", t.unit_id)] for t in turns]


def _calendar_and_numbers(turns) -> list[tuple[bool, bool]]:
    """Per turn: whether its text holds calendar words and number words."""
    found, missing = _BY_TURN.get_many([("when", t.unit_id) for t in turns])
    if missing:
        made = {("when", t.unit_id): (bool(_TIME_RE.search(t.text)), bool(_NUM_RE.search(t.text)))
                for t in turns if ("when", t.unit_id) not in found}
        _BY_TURN.put_many(made)
        found.update(made)
    return [found[("when", t.unit_id)] for t in turns]


def _turn_arrays(corpus) -> _Turns:
    cached = getattr(corpus, "_zeromem_turns", None)
    if cached is None:
        words = _turn_words(corpus.turns)
        ntok = np.array([n for n, _ in words], dtype=float)
        stems = [bag for _, bag in words]
        vocabulary = {w: j for j, w in enumerate(sorted({w for bag in stems for w in bag}))}
        rows = [i for i, bag in enumerate(stems) for _ in bag]
        cols = [vocabulary[w] for bag in stems for w in bag]
        has_stem = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(stems), len(vocabulary)))
        speakers = {s: k for k, s in enumerate(corpus.speakers)}
        cached = _Turns([t.unit_id for t in corpus.turns], stems, np.clip(np.log(ntok) / np.log(40), 0, 1), vocabulary, has_stem,
                        np.array([speakers[s] for s in corpus.speaker], dtype=int),
                        np.array([when.date().toordinal() for when in corpus.occurred], dtype=int))
        corpus._zeromem_turns = cached
    return cached


class ZeroMem:
    """One query's run of the method; `rank(mode)` returns the evidence ranking."""

    def __init__(self, ctx: QueryContext, cfg: ZeroMemConfig = DEFAULT):
        self.ctx = ctx
        self.cfg = cfg
        self.corpus = ctx.corpus
        self.n = ctx.corpus.n
        # Results that depend only on the question and some constants are kept on the context,
        # keyed by those constants, so that tuning can re-run the method under many configs.
        self.memo: dict = ctx.__dict__.setdefault("_zeromem_memo", {})

    def _memo(self, name: str, fields: tuple[str, ...], compute):
        key = (name, *(getattr(self.cfg, f) for f in fields))
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    # -- profile (eq. 6) -------------------------------------------------------------------
    @property
    def profile(self) -> Profile:
        return self._memo("profile", ("question_entities",), self._profile)

    def _profile(self) -> Profile:
        q = self.ctx.request.question
        with self.ctx.timed("profile"):
            if self.cfg.question_entities == "lexicon" or self.ctx.extractor is None:
                b = self.ctx.boundary
                try:
                    graph = self.ctx.store("graph")
                    labels = (lambda ids: graph.labels_of(b, ids)) if self.corpus.bounded else graph.entity_labels(b)
                    mentions = lexicon_mentions(q, b.tenant_id, labels)
                except ViewUnavailable:  # the graph view is down: the profile goes without its names (the service falls back)
                    mentions = lexicon_mentions(q, b.tenant_id, {})
            else:
                mentions = [(m.text, m.label, m.start, m.end) for m in self.ctx.extractor.analyze([q])[0].mentions]
            as_of = self.ctx.request.as_of or self.corpus.as_of
            p = build_profile(q, self.corpus.speakers, mentions, as_of)
        self.ctx.profile_dict = p.as_dict()
        return p

    @property
    def entity_vectors(self) -> np.ndarray:
        return self._memo("entity_vectors", ("question_entities",), self._entity_vectors)

    def _entity_vectors(self) -> np.ndarray:
        """The question's vector and its entities' vectors from one encoder pass: entity spans
        are pooled from the question's own token states (late chunking)."""
        return self.ctx.states_for("graph").pool(self.profile.entity_spans)

    # -- signals ---------------------------------------------------------------------------
    @property
    def lexcov(self) -> np.ndarray:
        return self._memo("lexcov", (), self._lexcov)

    def _lexcov(self) -> np.ndarray:
        """Share of the question's keywords (those the boundary knows) each turn contains."""
        turns = _turn_arrays(self.corpus)
        cols = sorted({turns.vocabulary[k] for k in self.profile.keywords if k in turns.vocabulary})
        if not cols:
            return np.zeros(self.n)
        wanted = np.zeros(turns.has_stem.shape[1])
        wanted[cols] = 1.0
        return (turns.has_stem @ wanted) / len(cols)  # a product, not a column slice: ~0.04 vs ~0.4 ms

    def _type_flags(self) -> dict[str, np.ndarray]:
        """Per turn: can it answer a date / number / place / person question? From the graph
        view's NER labels and calendar/number words. Independent of the question, so cached on
        the corpus until the graph view changes."""
        b, c = self.ctx.boundary, self.corpus
        try:
            graph = self.ctx.store("graph")
            if c.bounded:  # a question's candidates: their own mentions (the corpus is the question's alone)
                cached = getattr(c, "_type_flags", None)
                if cached is not None:
                    return cached[1]
                version, mentions = "bounded", graph.context_mentions(b, [t.unit_id for t in c.turns])
            else:
                version = (graph.generation, *(graph.conversation_version(b.tenant_id, conv) for conv in (b.conversation_ids or (None,))))
                cached = getattr(c, "_type_flags", None)
                if cached is not None and cached[0] == version:
                    return cached[1]
                mentions = graph.context_mentions(b)  # per turn: (entity id, label)
        except ViewUnavailable:  # the graph view is down: calendar and number words only (not cached)
            version, mentions = None, {}
        speakers = {entity_id(b.tenant_id, normalize_entity(s)) for s in c.speakers}
        words = np.array(_calendar_and_numbers(c.turns), dtype=float).reshape(-1, 2)
        flags = {"date": words[:, 0].copy(), "number": words[:, 1].copy(), "place": np.zeros(self.n), "person": np.zeros(self.n)}
        date, number, place, person = flags["date"], flags["number"], flags["place"], flags["person"]
        for i, t in enumerate(c.turns):
            found = mentions.get(t.unit_id)
            if not found:  # most turns: nothing but their words
                continue
            for eid, lab in found:
                if lab in _DATE_LABELS:
                    date[i] = 1.0
                if lab in _NUMBER_LABELS:
                    number[i] = 1.0
                if lab in _PLACE_LABELS:
                    place[i] = 1.0
                if lab == "PERSON":
                    if eid in speakers:  # a speaker named is not a person the question asks about
                        continue
                    person[i] = 1.0
                key = "label:" + lab
                if key not in flags:
                    flags[key] = np.zeros(self.n)
                flags[key][i] = 1.0
        flags["duration"] = np.maximum(date, number)
        if version is not None:
            c._type_flags = (version, flags)
        return flags

    @property
    def compat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._memo("compat", ("time_tau_days",), self._compat)

    def _compat(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Subject, answer-type and temporal compatibility per turn (eq. 15)."""
        c, p = self.corpus, self.profile
        turns = _turn_arrays(c)
        subject = {s.lower() for s in p.subject_speakers}
        subj = np.array([1.0 if s.lower() in subject else 0.0 for s in c.speakers])[turns.speaker] if self.n else np.zeros(0)
        atype = self._type_flags().get(p.answer_type, np.zeros(self.n))
        tcomp = np.zeros(self.n)
        if p.interval is not None:
            lo, hi = (d.toordinal() for d in p.interval)
            gap = np.where(turns.day < lo, lo - turns.day, np.where(turns.day > hi, turns.day - hi, 0))
            tcomp = np.maximum(0.0, 1.0 - gap / self.cfg.time_tau_days)
        return subj, atype, tcomp

    @property
    def answer_label(self) -> tuple[str | None, float]:
        return self._memo("answer_label", (), self._answer_label)

    def _answer_label(self) -> tuple[str | None, float]:
        noun = self.profile.noun
        if noun is None or self.ctx.extractor is None:
            return None, 0.0
        labels, vectors = _glossary_vectors(self.ctx.extractor, self.ctx.encoder)
        sims = vectors @ _word_vector(self.ctx.encoder, noun)
        best = int(np.argmax(sims))
        return labels[best], float(sims[best])

    @property
    def label_flags(self) -> np.ndarray:
        return self._memo("label_flags", ("label_min",), self._label_flags)

    def _label_flags(self) -> np.ndarray:
        label, score = self.answer_label
        if label is None or score < self.cfg.label_min:
            return np.zeros(self.n)
        return self._type_flags().get("label:" + label, np.zeros(self.n))

    def _dense(self, kind: str, level: int | None = None) -> np.ndarray:
        cfg = self.cfg
        base = mm(self.ctx.dense(kind, level))
        if not cfg.prf_weight:
            return base
        return (1 - cfg.prf_weight) * base + cfg.prf_weight * mm(self.ctx.dense(kind, level, self.prf_vector))

    @property
    def prf_vector(self) -> np.ndarray:
        return self._memo("prf", ("prf_k", "prf_alpha"), self._prf_vector)

    def _prf_vector(self) -> np.ndarray:
        """Rocchio feedback in the dense space from the top turns of a BM25 + dense first pass."""
        first = mm(self.ctx.bm25("turn")) + mm(self.ctx.dense("turn"))
        top = np.argsort(-first, kind="stable")[: self.cfg.prf_k]
        ids = [self.corpus.turns[i].unit_id for i in top]
        vecs = self.ctx.store("dense").vectors("turn", self.ctx.boundary.tenant_id, ids)
        q = self.ctx.qvec + self.cfg.prf_alpha * np.mean([vecs[i] for i in ids if i in vecs], axis=0)
        return (q / np.linalg.norm(q)).astype(np.float32)

    # -- hierarchy view (eq. 11) -------------------------------------------------------------
    HIERARCHY_FIELDS = ("a_lex", "w_turn", "w_windows", "w_episode", "w_neighbour", "h_lexical", "h_info", "prf_weight", "prf_k", "prf_alpha",
                        "lexical_prf_weight", "lexical_prf_docs", "lexical_prf_terms", "lexical_prf_types")
    GRAPH_FIELDS = ("question_entities", "align_min", "keyword_activation", "propagation_steps", "propagation_weight", "beta_entities", "prior_top",
                    "adjacency_weight", "hub_share", "gamma", "ppr_iterations")

    @property
    def hierarchy(self) -> np.ndarray:
        return self._memo("hierarchy", self.HIERARCHY_FIELDS, self._hierarchy)

    def _expansion(self) -> np.ndarray:
        """BM25 of an expansion query built from the top turns of a first pass (RM3-like)."""
        cfg, c = self.cfg, self.corpus
        first = mm(self.ctx.bm25("turn")) + mm(self.ctx.dense("turn"))
        top = np.argsort(-first, kind="stable")[: cfg.lexical_prf_docs]
        stems = _turn_arrays(c).stems
        df: dict[str, int] = {}
        for bag in stems:
            for t in bag:
                df[t] = df.get(t, 0) + 1
        query = set(self.profile.keywords) | {w for s in c.speakers for w in tokens(s)}
        weight: dict[str, float] = {}
        for i in top:
            for t in stems[i]:
                if t not in query and df[t] > 1 and not t.isdigit():
                    weight[t] = weight.get(t, 0.0) + float(first[i]) * np.log(c.n / df[t])
        terms = [t for t, _ in sorted(weight.items(), key=lambda kv: (-kv[1], kv[0]))[: cfg.lexical_prf_terms]]
        if not terms:
            return np.zeros(self.n)
        keys, scores = self.ctx.store("lexical").score_units("turn", " ".join(terms), self.ctx.boundary, c.n)
        return c.keys.scatter(keys, scores, fill=0.0)

    def _hierarchy(self) -> np.ndarray:
        cfg, c, a = self.cfg, self.corpus, self.cfg.a_lex
        with self.ctx.timed("hierarchy_view"):
            self.ctx.bm25_all()  # turns, windows and episodes from one search
            rel_turn = a * mm(self.ctx.bm25("turn")) + (1 - a) * self._dense("turn")
            if cfg.lexical_prf_weight and self.profile.answer_type in cfg.lexical_prf_types:
                expansion = self._memo("expansion", ("lexical_prf_docs", "lexical_prf_terms"), self._expansion)
                rel_turn = rel_turn + cfg.lexical_prf_weight * mm(expansion)
            h = cfg.w_turn * rel_turn
            for (size, level), weight in zip(sorted(c.windows.items()), cfg.w_windows):
                if weight and level.units:
                    rel = a * mm(self.ctx.bm25("window", size)) + (1 - a) * self._dense("window", size)
                    h = h + weight * _finite(level.lift(rel))
            if cfg.w_episode and c.episodes.units:
                rel = a * mm(self.ctx.bm25("episode")) + (1 - a) * self._dense("episode")
                h = h + cfg.w_episode * _finite(c.episodes.lift(rel))
            if cfg.w_neighbour:
                h = h + cfg.w_neighbour * self._neighbour_max(rel_turn)
            h = h + cfg.h_lexical * self.lexcov + cfg.h_info * _turn_arrays(c).info
        return h

    def _neighbour_max(self, x: np.ndarray) -> np.ndarray:
        follows = self.corpus.follows()  # turn i-1 is turn i's predecessor in the session
        left = np.where(follows, np.append(-np.inf, x[:-1]), -np.inf)
        right = np.where(np.append(follows[1:], False), np.append(x[1:], -np.inf), -np.inf)
        out = np.maximum(left, right)
        return np.where(np.isfinite(out), out, 0.0)

    # -- graph view (eq. 8-10) -----------------------------------------------------------------
    @property
    def activations(self) -> dict[str, float]:
        return self._memo("activations", ("question_entities", "align_min", "keyword_activation"), self._activations)

    def _activations(self) -> dict[str, float]:
        """Eq. 8: query entities aligned to graph entities (exact name, else cosine), plus
        keyword nodes matched by stem."""
        cfg, p = self.cfg, self.profile
        eta: dict[str, float] = {}
        if p.entities:
            vectors, b = self.entity_vectors, self.ctx.boundary
            among = {"among": [t.unit_id for t in self.corpus.turns]} if self.corpus.bounded else {}
            for match in self.ctx.store("graph").align_entities(b, [entity_id(b.tenant_id, e) for e in p.entities], vectors, 1, **among):
                if match and match[0].score >= cfg.align_min:
                    eta[match[0].entity_id] = max(eta.get(match[0].entity_id, 0.0), match[0].score)
        for e in self.keyword_nodes:
            eta[e] = max(eta.get(e, 0.0), cfg.keyword_activation)
        return eta

    @property
    def keyword_nodes(self) -> list[str]:
        return self._memo("keyword_nodes", (), self._keyword_nodes)

    def _keyword_nodes(self) -> list[str]:
        """The question's keyword nodes (by stem, speakers' names left out) present in the
        boundary; needs no vector, so it is found while the encoder runs."""
        b = self.ctx.boundary
        speakers = {w for s in self.corpus.speakers for w in normalize_entity(s).split()}
        words = [w for w in keyword_words(self.profile.question) if w not in speakers]
        ids = {entity_id(b.tenant_id, "kw:" + s): s for s, w in zip(stem(words), words) if len(s) > 2 and not w.isdigit()}
        try:
            return sorted(self.ctx.store("graph").present(b, list(ids)))
        except ViewUnavailable:  # the graph view is down: only its own modes need these (they fail over later)
            return []

    def _propagate(self, eta: dict[str, float]) -> tuple[list[str], np.ndarray]:
        """Eq. 9: an entity gains activation when it shares query-relevant sentences with an
        active one; a sentence's relevance is its dense similarity to the question (clipped at 0).
        With Z the sentences x entities incidence and w the relevances, one step is
        gained = Z^T (w * Z a), kept for entities not yet active, rescaled so that the best
        gain is `propagation_weight` times the strongest activation. Returns the activated
        entities (eta's first, then the gained ones in incidence order) and their activations."""
        cfg = self.cfg
        graph = self.ctx.store("graph")
        if self.corpus.bounded:  # the sentences of the activated entities, hubs left out (their sentences are the boundary's)
            degree = graph.entity_degrees(self.ctx.boundary, list(eta))
            sources = [e for e in eta if degree.get(e, 0) <= self.ctx.bounds.hub_cap]
            inc = graph.sentence_incidence(self.ctx.boundary, entity_ids=sources)
        else:
            inc = graph.sentence_incidence(self.ctx.boundary)
        eta_mass = np.fromiter(eta.values(), dtype=float, count=len(eta))
        if not cfg.propagation_steps or not inc.sentence_ids:
            return list(eta), eta_mass
        w = np.maximum(self.ctx.sentence_relevance(inc), 0.0)
        a = np.zeros(len(inc.entity_ids))
        for e, v in eta.items():
            j = inc.entity_index.get(e)
            if j is not None:
                a[j] = v
        active = a > 0
        strongest_outside = max((v for e, v in eta.items() if e not in inc.entity_index), default=0.0)
        Z, ZT = inc.matrix, inc.matrix_t
        for _ in range(cfg.propagation_steps):
            gained = ZT @ (w * (Z @ a))
            gained[a > 0] = 0.0
            top = float(gained.max(initial=0.0))
            if top <= 0:
                break
            a = a + gained * (cfg.propagation_weight * max(float(a.max(initial=0.0)), strongest_outside, 1e-9) / top)
        new = np.flatnonzero((a > 0) & ~active)
        return list(eta) + inc.entity_array[new].tolist(), np.concatenate([eta_mass, a[new]])

    @property
    def graph_scores(self) -> np.ndarray | None:
        return self._memo("graph_scores", self.GRAPH_FIELDS, self._graph_scores)

    def _graph_scores(self) -> np.ndarray | None:
        """Raw PPR scores of the boundary's contexts, or None when no entity aligns (eq. 10)."""
        with self.ctx.timed("graph_view"):
            eta = self.activations
            return self._walk(eta) if eta else None

    def _walk(self, eta: dict[str, float], prior_scores: np.ndarray | None = None) -> np.ndarray:
        """Eq. 9-10 from the activations `eta`: propagated over sentences, then a PPR whose reset
        mass is theirs (share beta_entities) and the top turns' by `prior_scores` (the rest; by
        default the dense view's)."""
        cfg = self.cfg
        ids, act = self._propagate(eta)
        total = sum(act.tolist())  # left to right, as over a dict of them
        keep = act > 0
        reset = dict(zip(compress(ids, keep.tolist()), (cfg.beta_entities * act[keep] / total).tolist())) if total else {}
        dn = self.ctx.dense("turn") if prior_scores is None else prior_scores
        top = np.argsort(-dn, kind="stable")[: cfg.prior_top]
        prior = np.clip(dn[top] - dn[top].min() + 1e-3, 1e-6, None)
        for i, w in zip(top, prior / prior.sum()):
            tid = self.corpus.turns[i].unit_id
            reset[tid] = reset.get(tid, 0.0) + (1 - cfg.beta_entities) * float(w)
        pi = self.ctx.store("graph").personalized_pagerank(
            self.ctx.boundary, reset, cfg.gamma, adjacency_weight=cfg.adjacency_weight, max_share=cfg.hub_share,
            max_iterations=cfg.ppr_iterations, **self._neighbourhood())
        return self._on_corpus(pi)

    def _neighbourhood(self) -> dict:
        """On the bounded path, a walk runs on the candidates' neighbourhood of the graph."""
        if not self.corpus.bounded:
            return {}
        bounds, turns = self.ctx.bounds, self.corpus.turns
        if bounds.walk_from and self.n > bounds.walk_from:  # the walk's neighbourhood grows from the best candidates only
            first = mm(self.ctx.bm25("turn")) + mm(self.ctx.dense("turn"))
            turns = [turns[i] for i in np.sort(np.argsort(-first, kind="stable")[: bounds.walk_from])]
        return {"contexts": [t.unit_id for t in turns], "contexts_total": self.corpus.size, "hub_cap": bounds.hub_cap,
                "per_entity": bounds.per_entity, "reach": bounds.reach}

    def _on_corpus(self, scores: dict[str, float]) -> np.ndarray:
        """Per-turn array (corpus order) of scores keyed by turn id; 0 for turns not in it."""
        return np.fromiter(map(scores.get, _turn_arrays(self.corpus).ids, repeat(0.0)), dtype=float, count=self.n)

    @property
    def graph(self) -> np.ndarray:
        s = self.graph_scores
        if s is None:
            return mm(self.ctx.dense("turn"))  # no aligned entity: the dense ranking (paper)
        return mm(s) + self.cfg.g_lexical * self.lexcov

    # -- fusion, closure, calibration ----------------------------------------------------------
    @property
    def route(self) -> str:
        return route_rules(self.profile) if self.cfg.route == "rules" else self.cfg.route

    def fused(self, mode: str) -> np.ndarray:
        if mode == "hierarchy-only":
            return mm(self.hierarchy)
        if mode == "graph-only":
            return mm(self.graph)
        primary, secondary = (self.graph, self.hierarchy) if self.route == "relational" else (self.hierarchy, self.graph)
        rho = self.cfg.rho
        return rho * mm(primary) + (1 - rho) * mm(secondary)

    def closure(self, order: list[int], mode: str = "zero-mem") -> dict[int, float]:
        """Eq. 14: contexts bridged to the top of M(q) through shared entities (a PPR seeded on
        them, speakers excluded since every turn of a speaker shares them), and optionally
        neighbouring turns. Returns bounded score bonuses."""
        cfg, corpus = self.cfg, self.corpus
        seeds = order[: min(cfg.closure_top, self.ctx.request.k)]
        bonus: dict[int, float] = {}
        if cfg.closure_graph and seeds:
            with self.ctx.timed("closure"):
                reset = {corpus.turns[i].unit_id: 1.0 / len(seeds) for i in seeds}
                try:
                    pi = self.ctx.store("graph").personalized_pagerank(
                        self.ctx.boundary, reset, cfg.closure_gamma, adjacency_weight=cfg.adjacency_weight,
                        exclude_labels=("SPEAKER",), max_iterations=cfg.closure_iterations, **self._neighbourhood())
                except ViewUnavailable:
                    if mode != "hierarchy-only":
                        raise  # a graph mode: the service falls back to hierarchy-only
                    pi = {}  # hierarchy-only with the graph view down: neighbours only (its own fallback)
                v = self._on_corpus(pi)
                v[seeds] = 0.0
                scored = [int(i) for i in _order(v)[: cfg.closure_graph] if v[i] > 0]  # ties: conversation order
                for i in scored:
                    bonus[i] = bonus.get(i, 0.0) + cfg.closure_bonus * v[i] / v[scored[0]]
        for i in seeds if cfg.closure_neighbours else []:
            for j in corpus.neighbours(i, cfg.closure_neighbours):
                if j != i:
                    bonus[j] = bonus.get(j, 0.0) + cfg.neighbour_bonus
        return bonus

    def _vector_free_signals(self) -> None:
        """What needs no question vector, computed while the encoder runs on the other core
        (prefetch_question): profile, keyword coverage, compatibility, the asked-for noun's
        label (whose word vector, when not cached, is a pass of its own) and the keyword nodes
        the graph view activates."""
        self.profile
        self.lexcov, self.compat, self.label_flags, self.keyword_nodes

    def _dense_kinds(self, mode: str) -> list[str]:
        """The unit kinds this mode's views score against the question's vector."""
        cfg, c = self.cfg, self.corpus
        kinds = ["turn"]
        if mode != "graph-only":
            if any(cfg.w_windows) and any(level.units for level in c.windows.values()):
                kinds.append("window")
            if cfg.w_episode and c.episodes.units:
                kinds.append("episode")
        if mode != "hierarchy-only" and cfg.propagation_steps:
            kinds.append("sentence")
        return kinds

    def _hierarchy_with_feedback(self, mode: str) -> np.ndarray:
        """The hierarchy view, after the feedback vector's dense reads in one round (they need the
        first round's turns)."""
        if self.cfg.prf_weight:
            self.ctx.prefetch_dense([k for k in self._dense_kinds(mode) if k != "sentence"], self.prf_vector)
        return self.hierarchy

    def scores(self, mode: str = "zero-mem") -> tuple[np.ndarray, dict[int, float], np.ndarray]:
        """(fused score, closure bonuses, calibrated score) per turn.

        On servers, independent round trips overlap (QueryContext.ahead): BM25 and the question's
        dense round (which waits for the encoder) beside the profile's and keyword nodes' graph
        reads and entity alignment, then the hierarchy view (feedback vector, its dense round)
        beside the graph view's PageRank. The arithmetic is the same in either order, so the
        scores are identical."""
        if mode not in MODES:
            raise ValueError(f"unknown Zero-Mem mode {mode!r}")
        graph_mode, hierarchy_mode = mode != "hierarchy-only", mode != "graph-only"
        self.ctx.prefetch_question()
        lexical = self.ctx.ahead(self.ctx.bm25_all, "lexical")  # BM25 of every level in one search
        dense = self.ctx.ahead(lambda: self.ctx.prefetch_dense(self._dense_kinds(mode)), "dense", deferred=True)  # needs the vector
        self._vector_free_signals()
        self.entity_vectors  # the question's and its entities' vectors, from the one forward pass
        aligned = self.ctx.ahead(lambda: self.activations, "graph") if graph_mode else None
        lexical.result(), dense.result()
        if aligned is not None:
            aligned.result()
        hierarchy = self.ctx.ahead(lambda: self._hierarchy_with_feedback(mode), "dense", "lexical") if hierarchy_mode else None
        if graph_mode:
            self.graph_scores
        if hierarchy is not None:
            hierarchy.result()
        fused = self.fused(mode)
        bonus = {} if mode == "no-closure" else self.closure(_order(fused).tolist(), mode)
        with self.ctx.timed("calibration"):
            score = fused.copy()
            for i, b in bonus.items():
                score[i] += b
            if mode != "no-calibration":
                subj, atype, tcomp = self.compat
                relational = self.route == "relational"
                cs = self.cfg.c_subject_relational if relational else self.cfg.c_subject
                ct = self.cfg.c_type_relational if relational else self.cfg.c_type
                score = score + cs * subj + ct * atype + self.cfg.c_time * tcomp
                if self.cfg.c_label:
                    score = score + self.cfg.c_label * self.label_flags
        return fused, bonus, score

    def order(self, mode: str = "zero-mem") -> np.ndarray:
        """Turn positions in evidence order."""
        return _order(self.scores(mode)[2])

    def rank(self, mode: str = "zero-mem") -> Ranking:
        fused, bonus, score = self.scores(mode)
        ranked = _order(score)
        k, budget = self.ctx.request.k, self.ctx.request.max_turns
        primary = set(_order(fused)[:k].tolist())
        graph_raw = self.graph_scores if mode != "hierarchy-only" else None
        h = self.hierarchy if mode != "graph-only" else None
        bm25, dense = self.ctx.bm25("turn"), self.ctx.dense("turn")  # the raw signals, on a scale of their own across responses
        candidates = []
        for i in ranked[: max(budget, k)].tolist():  # each candidate is one turn: the budget bounds the list
            role = "primary" if i in primary else ("bridge" if bonus.get(i) else "fill")
            scores = {"fused": float(fused[i]), "calibrated": float(score[i]), "bm25": float(bm25[i]), "dense": float(dense[i])}
            if h is not None:
                scores["hierarchy"] = float(h[i])
            if graph_raw is not None:
                scores["graph"] = float(graph_raw[i])
            candidates.append(Candidate(self.corpus.turns[i].unit_id, "turn", [i], role, scores, float(score[i])))
        notes = [] if graph_raw is not None or mode == "hierarchy-only" else \
            ["graph view: no query entity aligned; dense ranking used (paper's fallback)"]
        return Ranking(candidates, route=self.route if mode not in ("graph-only", "hierarchy-only") else mode.split("-")[0], notes=notes)


def _order(score: np.ndarray) -> np.ndarray:
    """Positions by descending score; ties keep conversation order."""
    return np.lexsort((np.arange(len(score)), -score))


_GLOSSARY: dict[int, tuple[list[str], np.ndarray]] = {}
_WORDS: dict[tuple[int, str], np.ndarray] = {}


def _glossary_vectors(extractor, encoder) -> tuple[list[str], np.ndarray]:
    key = id(encoder)
    if key not in _GLOSSARY:
        glossary = {k: v for k, v in extractor.label_glossary().items() if k not in ("CARDINAL", "ORDINAL", "PERCENT", "QUANTITY", "MONEY")}
        labels = sorted(glossary)
        _GLOSSARY[key] = (labels, encoder.encode([glossary[k] for k in labels]))
    return _GLOSSARY[key]


def _word_vector(encoder, word: str) -> np.ndarray:
    key = (id(encoder), word)
    if key not in _WORDS:
        if len(_WORDS) > 4096:
            _WORDS.clear()
        _WORDS[key] = encoder.encode([word])[0]
    return _WORDS[key]


def _finite(x: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(x), x, 0.0)


def strategy(mode: str, cfg: ZeroMemConfig = DEFAULT):
    def run(ctx: QueryContext) -> Ranking:
        return ZeroMem(ctx, cfg).rank(mode)

    run.__name__ = f"zeromem_{mode}"
    return run
