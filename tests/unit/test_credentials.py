"""Credentials and TLS for the server adapters come from URLs (users, schemes) and the environment
(secrets), are handed to the drivers, and never show in a repr or an error message."""

from __future__ import annotations

import pytest

from infra.registry import Registry
from infra.settings import Settings
from schemas.errors import ConfigurationError

pytestmark = pytest.mark.unit


def test_kafka_sasl_and_tls_from_the_url_and_the_password_from_the_environment():
    reg = Registry(Settings.load(log={"url": "kafka+ssl://svc@b1:9093,b2:9093?sasl_mechanism=scram-sha-256", "kafka_password": "pw-123"}))
    hosts, sec = reg.kafka_connection()
    assert hosts == "b1:9093,b2:9093" and sec.protocol == "SASL_SSL" and sec.mechanism == "SCRAM-SHA-256"
    assert sec.username == "svc" and sec.password == "pw-123" and "pw-123" not in repr(sec)
    kwargs = sec.client_kwargs()
    assert kwargs["sasl_plain_password"] == "pw-123" and kwargs["ssl_context"] is not None
    log = reg.event_log()
    assert log.bootstrap == "b1:9093,b2:9093" and log._common["security_protocol"] == "SASL_SSL"
    assert Registry(Settings.load(log={"url": "kafka://b:9092"})).kafka_connection()[1].protocol == "PLAINTEXT"
    assert Registry(Settings.load(log={"url": "kafka+ssl://b:9092"})).kafka_connection()[1].protocol == "SSL"
    with pytest.raises(ConfigurationError, match="MEMSTREAM_LOG_KAFKA_PASSWORD"):
        Registry(Settings.load(log={"url": "kafka://svc@b:9092"})).kafka_connection()
    with pytest.raises(ConfigurationError, match="sasl_mechanism"):
        Registry(Settings.load(log={"url": "kafka://svc@b:9092?sasl_mechanism=GSSAPI", "kafka_password": "x"})).kafka_connection()


def test_neo4j_user_and_password():
    reg = Registry(Settings.load(views={"graph_url": "neo4j+s://alice@db:7687", "neo4j_password": "pw-neo"}))
    assert reg._neo4j_uri(reg.view_url("graph")) == "neo4j+s://db:7687" and reg._neo4j_auth(reg.view_url("graph")) == ("alice", "pw-neo")
    only_password = Registry(Settings.load(views={"graph_url": "bolt://db:7687", "neo4j_password": "pw"}))
    assert only_password._neo4j_auth("bolt://db:7687") == ("neo4j", "pw")
    assert Registry(Settings.load())._neo4j_auth("bolt://db:7687") is None
    with pytest.raises(ConfigurationError, match="MEMSTREAM_VIEWS_NEO4J_PASSWORD"):
        Registry(Settings.load())._neo4j_auth("neo4j://bob@db:7687")


def test_opensearch_basic_auth_and_verified_tls():
    reg = Registry(Settings.load(views={"lexical_url": "opensearchs://ops@search:9200?prefix=p", "opensearch_password": "pw-os",
                                        "opensearch_ca_file": "/etc/ssl/ca.pem"}))
    options = reg._opensearch_options(reg.view_url("lexical"))
    assert options == {"http_auth": ("ops", "pw-os"), "use_ssl": True, "verify_certs": True, "ca_certs": "/etc/ssl/ca.pem"}
    store = reg.open_view("lexical", 1)
    assert store.url == "https://search:9200"  # no user in the URL the client and the messages use
    assert Registry(Settings.load())._opensearch_options("opensearch://search:9200") == {}
    with pytest.raises(ConfigurationError, match="MEMSTREAM_VIEWS_OPENSEARCH_PASSWORD"):
        Registry(Settings.load())._opensearch_options("opensearch://ops@search:9200")


def test_qdrant_api_key_and_tls():
    reg = Registry(Settings.load(views={"dense_url": "qdrants://vec:6333?grpc_port=6334", "qdrant_api_key": "qk-1"}))
    client = reg._qdrant(reg.view_url("dense"))
    o = client.init_options
    assert o["https"] is True and o["api_key"] == "qk-1" and o["prefer_grpc"] is True and o["grpc_port"] == 6334
    client.close()


def test_settings_never_show_secrets():
    s = Settings.load(log={"kafka_password": "pw-a"}, views={"neo4j_password": "pw-b", "opensearch_password": "pw-c", "qdrant_api_key": "pw-d"},
                      reader={"api_key": "pw-e"}, ops={"token": "pw-f"})
    text = repr(s) + str(s) + s.model_dump_json()
    assert not any(f"pw-{c}" in text for c in "abcdef")
