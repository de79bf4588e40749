"""The one place that maps configuration URLs to adapters.

`Registry(settings)` implements the `Backends` protocol the pipeline and the query service are
built from. Adapter modules are imported lazily, so the embedded mode never imports a server
client. An unknown scheme raises ConfigurationError naming what is accepted.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlparse

from infra.settings import Settings
from schemas.errors import ConfigurationError
from schemas.ports.views import ViewName

ACCEPTED = {
    "log": ("sqlite", "kafka"),
    "hierarchy": ("sqlite",),
    "lexical": ("tantivy",),
    "dense": ("sqlite",),
    "graph": ("sqlite",),
}


def _scheme(url: str, what: str) -> tuple[str, str]:
    """(scheme, location). `sqlite:///abs/file` -> '/abs/file'; `sqlite://rel/file` -> 'rel/file'."""
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    if scheme not in ACCEPTED[what]:
        accepted = ", ".join(f"{s}://" for s in ACCEPTED[what])
        raise ConfigurationError(f"unsupported {what} URL {url!r}: accepted schemes are {accepted}")
    return scheme, parsed.netloc + parsed.path


class Registry:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.data_dir = Path(settings.data_dir)
        self._encoder = None
        self._extractor = None
        self._catalog = None

    # -- event log -----------------------------------------------------------------------
    def event_log(self):
        scheme, rest = _scheme(self.settings.log.url, "log")
        if scheme == "sqlite":
            from infra.log.sqlite import SqliteEventLog

            return SqliteEventLog(Path(rest) if rest else self.data_dir / "log.sqlite")
        # kafka://host:port[,host:port][?replication_factor=N]
        from urllib.parse import parse_qs

        from infra.log.kafka import KafkaEventLog

        brokers, query = rest.strip("/"), parse_qs(urlparse(self.settings.log.url).query)
        replication = query.get("replication_factor", ["1"])[0]
        if not brokers or not replication.isdigit():
            raise ConfigurationError(f"bad Kafka log URL {self.settings.log.url!r}: expected kafka://host:port[,host:port][?replication_factor=N]")
        return KafkaEventLog(brokers, replication_factor=int(replication))

    # -- views ---------------------------------------------------------------------------
    def catalog(self):
        if self._catalog is None:
            from infra.catalog.sqlite import SqliteViewCatalog

            self._catalog = SqliteViewCatalog(self.data_dir / "views" / "catalog.sqlite")
        return self._catalog

    def view_dir(self, view: ViewName, generation: int) -> Path:
        return self.data_dir / "views" / view / f"gen-{generation}"

    def open_view(self, view: ViewName, generation: int):
        url = getattr(self.settings.views, f"{view}_url")
        scheme, _ = _scheme(url, view)
        d = self.view_dir(view, generation)
        if view == "hierarchy":
            from infra.units.sqlite import SqliteUnitStore

            return SqliteUnitStore(d / "units.sqlite", generation)
        if view == "lexical":
            from infra.lexical.tantivy import TantivyLexicalIndex

            return TantivyLexicalIndex(d, generation)
        if view == "dense":
            from infra.vectors.sqlite import SqliteVectorStore

            return SqliteVectorStore(d / "vectors.sqlite", generation)
        if view == "graph":
            from infra.graph.sqlite import SqliteGraphStore

            return SqliteGraphStore(d / "graph.sqlite", generation)
        raise ConfigurationError(f"unknown view {view!r}")

    def drop_view(self, view: ViewName, generation: int) -> None:
        """Reclaim a retired generation's storage."""
        shutil.rmtree(self.view_dir(view, generation), ignore_errors=True)
        self.catalog().drop(view, generation)

    def lock_path(self, view: ViewName, generation: int) -> Path:
        return self.view_dir(view, generation) / "writer.lock"

    # -- models --------------------------------------------------------------------------
    def encoder(self):
        if self._encoder is None:
            from infra.models.flagembedding import FlagEmbeddingEncoder

            e = self.settings.encoder
            self._encoder = FlagEmbeddingEncoder(e.model, e.path, max_length=e.max_length, batch_size=e.batch_size, threads=e.threads)
        return self._encoder

    def extractor(self):
        if self._extractor is None:
            from infra.models.spacy import SpacyEntityExtractor

            self._extractor = SpacyEntityExtractor(self.settings.ner.model, self.settings.ner.batch_size)
        return self._extractor
