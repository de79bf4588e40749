"""Contract of the ViewCatalog port: which generation of each view is live; replay builds a new
one beside it and `activate` switches readers atomically. Run against every adapter."""

from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.contract


def _sqlite(request, tmp_path):
    from infra.catalog.sqlite import SqliteViewCatalog

    return SqliteViewCatalog(tmp_path / "catalog.sqlite")


def _neo4j(request, tmp_path):
    from infra.catalog.neo4j import Neo4jViewCatalog

    # The server is shared by the session; tests are isolated by their fresh view names
    # (the `view` fixture), whose catalog nodes are deleted afterwards.
    from tests.integration.servers import neo4j_auth

    catalog = Neo4jViewCatalog(request.getfixturevalue("neo4j_uri"), auth=neo4j_auth())
    view = request.getfixturevalue("view")

    def cleanup():
        with catalog._driver.session() as s:
            s.run("MATCH (n) WHERE (n:MemstreamGeneration OR n:MemstreamCatalogLock) AND n.view STARTS WITH $view DETACH DELETE n",
                  view=view).consume()
        catalog.close()

    request.addfinalizer(cleanup)
    return catalog


def _opensearch(request, tmp_path):
    from opensearchpy import OpenSearch

    from infra.catalog.opensearch import OpenSearchViewCatalog

    # A fresh index prefix per test; afterwards every index it made (catalog, anchors) is deleted.
    url, prefix = request.getfixturevalue("opensearch_url"), f"contract-{uuid.uuid4().hex[:10]}"
    catalog = OpenSearchViewCatalog(url, prefix)

    def cleanup():
        catalog.close()
        client = OpenSearch(hosts=[url])
        names = list(client.indices.get(index=f"{prefix}-*", expand_wildcards="all", allow_no_indices=True))
        if names:
            client.indices.delete(index=",".join(names))
        client.close()

    request.addfinalizer(cleanup)
    return catalog


def _qdrant_local(request, tmp_path):
    from infra.catalog.qdrant import QdrantViewCatalog

    # qdrant-client's local mode (the `qdrant+local://` option), in the test's directory.
    catalog = QdrantViewCatalog(str(tmp_path / "qdrant"), f"contract-{uuid.uuid4().hex[:10]}")
    request.addfinalizer(catalog.close)
    return catalog


def _qdrant_server(request, tmp_path):
    from infra.catalog.qdrant import QdrantViewCatalog
    from tests.integration.servers import drop_qdrant_prefix, qdrant_test_client

    # The real server: a fresh prefix per test; every collection it made (catalog, anchors) is deleted after.
    client, prefix = qdrant_test_client(request.getfixturevalue("qdrant_url")), f"contract-{uuid.uuid4().hex[:10]}"
    catalog = QdrantViewCatalog(client, prefix)
    request.addfinalizer(lambda: (catalog.close(), drop_qdrant_prefix(request.getfixturevalue("qdrant_url"), prefix)))
    return catalog


ADAPTERS = {"sqlite": _sqlite, "neo4j": _neo4j, "opensearch": _opensearch, "qdrant-local": _qdrant_local, "qdrant-server": _qdrant_server}
NEEDS_SERVER = {"neo4j", "opensearch", "qdrant-server"}


@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.integration) if name in NEEDS_SERVER else name for name in sorted(ADAPTERS)])
def catalog(request, tmp_path):
    return ADAPTERS[request.param](request, tmp_path)


@pytest.fixture
def view():
    # A fresh view name per test, so adapters that share a server never see each other's state.
    return f"lexical{uuid.uuid4().hex[:6]}"


def test_generations_are_reserved_then_activated(catalog, view):
    assert catalog.current(view) is None
    g1 = catalog.new_generation(view)
    assert catalog.current(view) is None and catalog.building(view) == [g1]
    catalog.activate(view, g1)
    assert catalog.current(view) == g1 and catalog.building(view) == [] and catalog.retired(view) == []


def test_activation_switches_and_retires_the_previous_generation(catalog, view):
    g1 = catalog.new_generation(view)
    catalog.activate(view, g1)
    g2 = catalog.new_generation(view)
    assert g2 > g1 and catalog.current(view) == g1  # building does not disturb readers
    catalog.activate(view, g2)
    assert catalog.current(view) == g2 and catalog.retired(view) == [g1]
    catalog.drop(view, g1)
    assert catalog.retired(view) == []
    assert catalog.new_generation(view) > g2  # numbers are never reused


def test_a_generation_records_the_model_it_is_built_with(catalog, view):
    g1 = catalog.new_generation(view)
    g2 = catalog.new_generation(view, model="hashing-64")
    assert catalog.model(view, g1) is None and catalog.model(view, g2) == "hashing-64"
    catalog.activate(view, g2)
    assert catalog.model(view, g2) == "hashing-64"  # kept through the switch
    assert catalog.model(view, g2 + 100) is None


def test_views_are_independent(catalog, view):
    other = view + "x"
    catalog.activate(view, catalog.new_generation(view))
    assert catalog.current(other) is None
