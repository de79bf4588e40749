"""How memstream authenticates to Kafka and protects the connection: the one description that the
log adapter (aiokafka clients), the faust worker and the tests' foreign producer (kcat) are all
built from.

From the log URL and the environment (infra/registry.py):

    kafka://host:port[,host:port]                  PLAINTEXT
    kafka://USER@host:port?sasl_mechanism=M        SASL_PLAINTEXT (M: SCRAM-SHA-512 default, SCRAM-SHA-256, PLAIN)
    kafka+ssl://host:port                          SSL (TLS; CA from MEMSTREAM_LOG_KAFKA_CA_FILE, else the system's)
    kafka+ssl://USER@host:port?sasl_mechanism=M    SASL_SSL

The password is never in the URL (URLs end up in logs and process listings): it comes from
MEMSTREAM_LOG_KAFKA_PASSWORD. `repr` never shows it.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Literal

Protocol = Literal["PLAINTEXT", "SASL_PLAINTEXT", "SSL", "SASL_SSL"]
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")


@dataclass(frozen=True)
class KafkaSecurity:
    protocol: Protocol = "PLAINTEXT"
    mechanism: str = "SCRAM-SHA-512"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None

    @property
    def sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        return ssl.create_default_context(cafile=self.ca_file) if self.ca_file else ssl.create_default_context()

    def client_kwargs(self) -> dict:
        """Keyword arguments for every aiokafka client (producer, consumers, admin)."""
        out: dict = {"security_protocol": self.protocol}
        if self.tls:
            out["ssl_context"] = self.ssl_context()
        if self.sasl:
            out.update(sasl_mechanism=self.mechanism, sasl_plain_username=self.username, sasl_plain_password=self.password)
        return out

    def faust_credentials(self):
        """faust's broker_credentials (None for PLAINTEXT)."""
        import faust

        if self.sasl:
            return faust.SASLCredentials(username=self.username, password=self.password, mechanism=self.mechanism,
                                         ssl_context=self.ssl_context())
        if self.tls:
            return faust.SSLCredentials(self.ssl_context())
        return None

    def librdkafka_config(self) -> dict[str, str]:
        """The same as librdkafka properties (kcat -F FILE), for foreign producers."""
        out = {"security.protocol": self.protocol.lower()}
        if self.sasl:
            out.update({"sasl.mechanisms": self.mechanism, "sasl.username": self.username or "", "sasl.password": self.password or ""})
        if self.tls and self.ca_file:
            out["ssl.ca.location"] = self.ca_file
        return out
