"""The one place that maps configuration URLs to adapters.

`Registry(settings)` implements the `Backends` protocol the pipeline and the query service are
built from. Adapter modules are imported lazily, so the embedded mode never imports a server
client. An unknown scheme raises ConfigurationError naming what is accepted.

| what      | embedded            | servers                                                        |
|-----------|---------------------|----------------------------------------------------------------|
| log       | sqlite://[path]     | kafka[+ssl]://[USER@]host:port[,…][?replication_factor=N&sasl_mechanism=M] |
| hierarchy | sqlite://           | opensearch://[USER@]host:port[?prefix=memstream] (opensearchs:// TLS) |
| lexical   | tantivy://          | opensearch://[USER@]host:port[?prefix=memstream]               |
| dense     | sqlite://           | qdrant://host:port[?prefix=…&grpc_port=N] (qdrants:// TLS),    |
|           |                     | or qdrant+local://[path] (qdrant-client's in-process mode)     |
| graph     | sqlite://           | neo4j://[USER@]host:port or bolt://… (neo4j+s://, bolt+s:// TLS) |

Secrets never go in URLs (they end up in logs and process listings): passwords and keys come
from MEMSTREAM_LOG_KAFKA_PASSWORD, MEMSTREAM_VIEWS_NEO4J_PASSWORD,
MEMSTREAM_VIEWS_OPENSEARCH_PASSWORD and MEMSTREAM_VIEWS_QDRANT_API_KEY.

Each view's generations are tracked by its backend's catalog (a SQLite file for embedded views,
aliases on OpenSearch and Qdrant, a catalog node set on Neo4j), so replay switches readers the
way that backend does it.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from infra.settings import Settings
from schemas.errors import ConfigurationError
from schemas.ports.views import ViewName

ACCEPTED = {
    "log": ("sqlite", "kafka", "kafka+ssl"),
    "hierarchy": ("sqlite", "opensearch", "opensearchs"),
    "lexical": ("tantivy", "opensearch", "opensearchs"),
    "dense": ("sqlite", "qdrant", "qdrants", "qdrant+local"),
    "graph": ("sqlite", "neo4j", "bolt", "neo4j+s", "bolt+s"),
    "keys": ("sqlite", "opensearch", "opensearchs"),
}
EMBEDDED = ("sqlite", "tantivy")
INT8_SUFFIX = "+int8"  # an encoder name's suffix for its 8-bit quantised export (MEMSTREAM_ENCODER_PRECISION=int8)


def _scheme(url: str, what: str) -> tuple[str, str]:
    """(scheme, location). `sqlite:///abs/file` -> '/abs/file'; `sqlite://rel/file` -> 'rel/file'."""
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme not in ACCEPTED[what]:
        accepted = ", ".join(f"{s}://" for s in ACCEPTED[what])
        raise ConfigurationError(f"unsupported {what} URL {url!r}: accepted schemes are {accepted}")
    return scheme, parsed.netloc + parsed.path


def _option(url: str, name: str, default: str) -> str:
    return parse_qs(urlparse(url).query).get(name, [default])[0]


def _http(url: str) -> str:
    """The server's base URL, without credentials."""
    parsed = urlparse(url)
    return f"{'https' if parsed.scheme.endswith('s') else 'http'}://{parsed.netloc.rpartition('@')[2]}"


def _user(url: str) -> str | None:
    return urlparse(url).netloc.rpartition("@")[0] or None


class _CatalogRouter:
    """A ViewCatalog that sends each view to its backend's catalog, opened on first use (a
    process that never touches a view never connects to its backend)."""

    def __init__(self, make):
        self._make = make
        self._by_view: dict[str, object] = {}
        self._lock = threading.Lock()

    def _for(self, view: ViewName):
        with self._lock:
            if view not in self._by_view:
                self._by_view[view] = self._make(view)
            return self._by_view[view]

    def current(self, view):
        return self._for(view).current(view)

    def new_generation(self, view, model=None):
        return self._for(view).new_generation(view, model)

    def model(self, view, generation):
        return self._for(view).model(view, generation)

    def activate(self, view, generation):
        return self._for(view).activate(view, generation)

    def building(self, view):
        return self._for(view).building(view)

    def retired(self, view):
        return self._for(view).retired(view)

    def drop(self, view, generation):
        return self._for(view).drop(view, generation)


class Registry:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.data_dir = Path(settings.data_dir)
        self._encoder = None
        self._other_encoders: dict[str, object] = {}
        self._models_lock = threading.Lock()
        self._extractor = None
        self._catalog = None
        self._keystore = None
        self._qdrant_clients: dict[str, object] = {}
        self._lock = threading.Lock()

    # -- event log -----------------------------------------------------------------------
    def embedded_log_path(self) -> Path | None:
        """The embedded log's file (None when the log is Kafka)."""
        scheme, rest = _scheme(self.settings.log.url, "log")
        if scheme != "sqlite":
            return None
        return Path(rest) if rest else self.data_dir / "log.sqlite"

    def kafka_connection(self):
        """(bootstrap servers, KafkaSecurity) of a Kafka log URL (infra/log/kafka_security.py)."""
        from infra.log.kafka_security import MECHANISMS, KafkaSecurity

        url = self.settings.log.url
        scheme, _ = _scheme(url, "log")
        parsed = urlparse(url)
        user, _, hosts = parsed.netloc.rpartition("@")
        mechanism = _option(url, "sasl_mechanism", "SCRAM-SHA-512").upper()
        if not hosts or any(not h.rpartition(":")[2].isdigit() for h in hosts.split(",")):
            raise ConfigurationError(f"bad Kafka log URL {url!r}: expected kafka[+ssl]://[USER@]host:port[,host:port][?replication_factor=N]")
        if mechanism not in MECHANISMS:
            raise ConfigurationError(f"bad Kafka log URL {url!r}: sasl_mechanism must be one of {', '.join(MECHANISMS)}")
        password = self.settings.log.kafka_password
        if user and password is None:
            raise ConfigurationError(f"the Kafka log URL names user {user!r}: set MEMSTREAM_LOG_KAFKA_PASSWORD to its password")
        tls = scheme == "kafka+ssl"
        protocol = ("SASL_SSL" if tls else "SASL_PLAINTEXT") if user else ("SSL" if tls else "PLAINTEXT")
        ca = self.settings.log.kafka_ca_file
        return hosts, KafkaSecurity(protocol, mechanism, user or None, password.get_secret_value() if password else None,
                                    str(ca) if ca else None)

    def event_log(self):
        url = self.settings.log.url
        scheme, rest = _scheme(url, "log")
        if scheme == "sqlite":
            from infra.log.sqlite import SqliteEventLog

            return SqliteEventLog(self.embedded_log_path())
        from infra.log.kafka import KafkaEventLog

        replication = _option(url, "replication_factor", "1")
        if not replication.isdigit():
            raise ConfigurationError(f"bad Kafka log URL {url!r}: replication_factor must be a number")
        brokers, security = self.kafka_connection()
        return KafkaEventLog(brokers, replication_factor=int(replication), security=security,
                             request_timeout=self.settings.log.request_timeout_seconds)

    # -- data keys -------------------------------------------------------------------------
    def keystore(self):
        """The data key store (one per registry: it is shared by the publisher, the projections,
        the eraser and the stores that seal text)."""
        with self._lock:
            if self._keystore is None:
                url = self.settings.keys.url
                scheme, rest = _scheme(url, "keys")
                if scheme == "sqlite":
                    from infra.keystore.sqlite import SqliteKeyStore

                    self._keystore = SqliteKeyStore(Path(rest) if rest.strip("/") else self.data_dir / "keys.sqlite")
                else:
                    from infra.keystore.opensearch import OpenSearchKeyStore

                    self._keystore = OpenSearchKeyStore(_http(url), _option(url, "prefix", "memstream"), **self._opensearch_options(url))
            return self._keystore

    def sealer(self):
        """Seals turn text for the stores that cannot erase (Qdrant, Neo4j)."""
        from schemas.sealing import KeyStoreSealer

        return KeyStoreSealer(self.keystore())

    # -- views ---------------------------------------------------------------------------
    def view_url(self, view: ViewName) -> str:
        return getattr(self.settings.views, f"{view}_url")

    def catalog(self):
        if self._catalog is None:
            shared: dict[tuple, object] = {}

            def make(view: ViewName):
                url = self.view_url(view)
                scheme, _ = _scheme(url, view)
                key = self._catalog_key(scheme, url)
                if key not in shared:
                    shared[key] = self._make_catalog(scheme, url)
                return shared[key]

            self._catalog = _CatalogRouter(make)
        return self._catalog

    def _catalog_key(self, scheme: str, url: str) -> tuple:
        if scheme in EMBEDDED:
            return ("sqlite",)
        return (scheme, urlparse(url).netloc, urlparse(url).path, _option(url, "prefix", "memstream"))

    def _make_catalog(self, scheme: str, url: str):
        prefix = _option(url, "prefix", "memstream")
        if scheme in EMBEDDED:
            from infra.catalog.sqlite import SqliteViewCatalog

            return SqliteViewCatalog(self.data_dir / "views" / "catalog.sqlite")
        if scheme.startswith("opensearch"):
            from infra.catalog.opensearch import OpenSearchViewCatalog

            return OpenSearchViewCatalog(_http(url), prefix, **self._opensearch_options(url))
        if scheme.startswith("qdrant"):
            from infra.catalog.qdrant import QdrantViewCatalog

            return QdrantViewCatalog(self._qdrant(url), prefix)
        from infra.catalog.neo4j import Neo4jViewCatalog

        return Neo4jViewCatalog(self._neo4j_uri(url), auth=self._neo4j_auth(url))

    def view_dir(self, view: ViewName, generation: int) -> Path:
        return self.data_dir / "views" / view / f"gen-{generation}"

    def open_view(self, view: ViewName, generation: int):
        url = self.view_url(view)
        scheme, _ = _scheme(url, view)
        d = self.view_dir(view, generation)
        prefix = _option(url, "prefix", "memstream")
        if view == "hierarchy":
            if scheme == "sqlite":
                from infra.units.sqlite import SqliteUnitStore

                return SqliteUnitStore(d / "units.sqlite", generation)
            from infra.units.opensearch import OpenSearchUnitStore

            return OpenSearchUnitStore(_http(url), prefix, generation, **self._opensearch_options(url))
        if view == "lexical":
            if scheme == "tantivy":
                from infra.lexical.tantivy import TantivyLexicalIndex

                return TantivyLexicalIndex(d, generation)
            from infra.lexical.opensearch import OpenSearchLexicalIndex

            return OpenSearchLexicalIndex(_http(url), prefix, generation, **self._opensearch_options(url))
        if view == "dense":
            if scheme == "sqlite":
                from infra.vectors.sqlite import SqliteVectorStore

                views = self.settings.views
                return SqliteVectorStore(d / "vectors.sqlite", generation, exact_limit=views.dense_exact_limit,
                                         max_points=views.dense_max_points)
            from infra.vectors.qdrant import QdrantVectorStore

            return QdrantVectorStore(self._qdrant(url), prefix, generation, sealer=self.sealer())
        if view == "graph":
            if scheme == "sqlite":
                from infra.graph.sqlite import SqliteGraphStore

                return SqliteGraphStore(d / "graph.sqlite", generation, max_contexts=self.settings.views.graph_max_contexts)
            from infra.graph.neo4j import Neo4jGraphStore

            return Neo4jGraphStore(self._neo4j_uri(url), generation, auth=self._neo4j_auth(url))
        raise ConfigurationError(f"unknown view {view!r}")

    def _qdrant(self, url: str):
        """One client per Qdrant location and process: local mode allows a single opener, and a
        server client keeps its connections warm. `grpc_port=N` in the URL sends every call over
        gRPC (the faster path for the query service); without it the client speaks REST. The API
        key comes from MEMSTREAM_VIEWS_QDRANT_API_KEY, never from the URL (URLs get logged)."""
        scheme, rest = _scheme(url, "dense")
        with self._lock:
            client = self._qdrant_clients.get(url)
            if client is None:
                from qdrant_client import QdrantClient

                if scheme == "qdrant+local":
                    path = Path(rest) if rest.strip("/") else self.data_dir / "qdrant"
                    path.mkdir(parents=True, exist_ok=True)
                    client = QdrantClient(path=str(path))
                else:
                    from infra.qdrant_base import connect

                    grpc = _option(url, "grpc_port", "")
                    if grpc and not grpc.isdigit():
                        raise ConfigurationError(f"bad Qdrant URL {url!r}: grpc_port must be a port number")
                    key = self.settings.views.qdrant_api_key
                    try:
                        client = connect(urlparse(url).netloc, https=scheme == "qdrants", grpc_port=int(grpc) if grpc else None,
                                         api_key=key.get_secret_value() if key else None)
                    except ValueError as exc:
                        raise ConfigurationError(f"bad Qdrant URL {url!r}: {exc}; expected qdrant://host:port[?prefix=…&grpc_port=N]") from None
                self._qdrant_clients[url] = client
            return client

    @staticmethod
    def _neo4j_uri(url: str) -> str:
        parsed = urlparse(url)
        return f"{parsed.scheme}://{parsed.netloc.rpartition('@')[2]}"

    def _neo4j_auth(self, url: str) -> tuple[str, str] | None:
        """neo4j://USER@host:port with MEMSTREAM_VIEWS_NEO4J_PASSWORD; a password alone means user neo4j."""
        password = self.settings.views.neo4j_password
        user = _user(url)
        if password is None:
            if user:
                raise ConfigurationError(f"the graph URL names user {user!r}: set MEMSTREAM_VIEWS_NEO4J_PASSWORD to its password")
            return None
        return (user or "neo4j", password.get_secret_value())

    def _opensearch_options(self, url: str) -> dict:
        """Basic auth (opensearch[s]://USER@host:port + MEMSTREAM_VIEWS_OPENSEARCH_PASSWORD) and TLS
        (opensearchs://, certificates verified against MEMSTREAM_VIEWS_OPENSEARCH_CA_FILE or the system's)."""
        out: dict = {}
        user, password = _user(url), self.settings.views.opensearch_password
        if user:
            if password is None:
                raise ConfigurationError(f"the OpenSearch URL names user {user!r}: set MEMSTREAM_VIEWS_OPENSEARCH_PASSWORD")
            out["http_auth"] = (user, password.get_secret_value())
        if urlparse(url).scheme == "opensearchs":
            out.update(use_ssl=True, verify_certs=True)
            ca = self.settings.views.opensearch_ca_file
            if ca:
                out["ca_certs"] = str(ca)
        return out

    def drop_view(self, view: ViewName, generation: int) -> None:
        """Reclaim a retired generation's storage."""
        scheme, _ = _scheme(self.view_url(view), view)
        if scheme in EMBEDDED:
            shutil.rmtree(self.view_dir(view, generation), ignore_errors=True)
        self.catalog().drop(view, generation)  # server catalogs delete the generation's indices/collections/nodes

    def lock_path(self, view: ViewName, generation: int) -> Path:
        return self.view_dir(view, generation) / "writer.lock"

    def single_machine(self) -> bool:
        """Whether every process of the deployment runs on this machine (the embedded log), so a
        file lock tells whether a generation is being built."""
        return _scheme(self.settings.log.url, "log")[0] == "sqlite"

    def shared_writers(self, view: ViewName) -> bool:
        """Whether several processes may write this view at once: yes when a Kafka consumer group
        splits the partitions between them and the store is a server (each write names its own
        partitions' positions); no for embedded stores (tantivy admits one writer, SQLite files
        live on one machine) and Qdrant's local mode (one process)."""
        log_scheme, _ = _scheme(self.settings.log.url, "log")
        view_scheme, _ = _scheme(self.view_url(view), view)
        return log_scheme != "sqlite" and view_scheme not in EMBEDDED and view_scheme != "qdrant+local"

    def close(self) -> None:
        for client in self._qdrant_clients.values():
            client.close()
        self._qdrant_clients.clear()

    # -- models --------------------------------------------------------------------------
    @property
    def encoder_name(self) -> str:
        """The configured encoder's name as generations record it (infra/catalog: `model`)."""
        model = self.settings.encoder.model
        if model == "hashing":
            return "hashing-256"
        return f"{model}{INT8_SUFFIX}" if self.settings.encoder.precision == "int8" and not model.startswith("hashing") else model

    def encoder(self, name: str | None = None):
        """The configured encoder, or (`name`) the one a view generation was built with: a
        generation's vectors and its questions come from one model, so a generation built before
        the configuration changed keeps its own until a replay replaces it."""
        if name is not None and name != self.encoder_name:
            with self._models_lock:  # queries ask from several threads; load a model once
                if name not in self._other_encoders:
                    enc = self._make_encoder(name, None)
                    enc.start()
                    self._other_encoders[name] = enc
            return self._other_encoders[name]
        if self._encoder is None:
            self._encoder = self._make_encoder(self.encoder_name, self.settings.encoder.path)
        return self._encoder

    def use_models(self, encoder, extractor) -> "Registry":
        """Use already loaded models (tests load them once per session), the NER behind the gate the
        settings name, as `extractor()` would build it. Returns self."""
        from infra.models.ner_gate import gated

        self._encoder, self._extractor = encoder, gated(extractor, self.settings.ner.gate)
        return self

    def share_models(self, other: "Registry") -> "Registry":
        """Use `other`'s loaded encoder and NER (one copy in memory for several stores' registries:
        benchmarks and tests that open more than one data directory). Returns self."""
        self._encoder, self._extractor = other.encoder(), other.extractor()
        return self

    def _make_encoder(self, name: str, path: str | None):
        if name.startswith("hashing"):
            from infra.models.fast import HashingEncoder  # the declared fast path (tests, benchmarks): not a language model

            dim = name.removeprefix("hashing").lstrip("-")
            if dim and not dim.isdigit():
                raise ConfigurationError(f"encoder model {name!r}: expected hashing or hashing-<dim>")
            return HashingEncoder(int(dim) if dim else 256)
        from infra.models.flagembedding import FlagEmbeddingEncoder

        e = self.settings.encoder
        base, int8 = (name.removesuffix(INT8_SUFFIX), True) if name.endswith(INT8_SUFFIX) else (name, False)
        return FlagEmbeddingEncoder(base, path, max_length=e.max_length, batch_size=e.batch_size, threads=e.threads,
                                    runtime=e.runtime, cache_dir=e.cache_dir, precision="int8" if int8 else "fp32")

    def extractor(self):
        if self._extractor is None and self.settings.ner.model == "lexicon":
            from infra.models.fast import LexiconExtractor  # the declared fast path (tests, benchmarks): not a language model

            self._extractor = LexiconExtractor()
        if self._extractor is None:
            from infra.models.spacy import SpacyEntityExtractor

            from infra.models.ner_gate import gated

            self._extractor = gated(SpacyEntityExtractor(self.settings.ner.model, self.settings.ner.batch_size), self.settings.ner.gate)
        return self._extractor
