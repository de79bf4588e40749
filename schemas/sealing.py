"""Crypto-shredding: what memstream writes to the log is sealed with a data key per event
(schemas/ports/keystore.py), so that forgetting destroys the key rather than rewriting the log.

A sealed record is a JSON envelope — readable ids, an AES-256-GCM ciphertext of the event:

    {"type": "Sealed", "schema_version": 1, "event_type": "TurnRecorded", "tenant_id": …,
     "conversation_id": …, "event_id": …, "key_id": …, "nonce": base64, "ciphertext": base64}

The associated data binds the ciphertext to its ids (a ciphertext moved to another event's
envelope fails to open). The cipher is the `cryptography` package's AESGCM (authenticated:
a flipped bit is an error, never wrong text); nonces are 96 random bits per seal.

Record headers carry the ids and the turn's time (`tenant`, `conversation`, `session`, `agent`,
`event_id`, `occurred_at`) so that the eraser can find a scope's records without any key.

`TextSealer` seals single fields (turn text in a ledger) with the same per-event key, for
stores that cannot erase what they once wrote (Qdrant's write-ahead log, Neo4j's store files).
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from typing import Iterable, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from schemas.errors import InvalidEvent

SEALED = "Sealed"
_NONCE = 12


def new_secret() -> bytes:
    return AESGCM.generate_key(bit_length=256)


def _aad(*parts: str) -> bytes:
    return json.dumps(["memstream-sealed-v1", *parts], separators=(",", ":")).encode()


def seal(plaintext: bytes, secret: bytes, *, key_id: str, tenant_id: str, conversation_id: str, event_id: str,
         event_type: str = "TurnRecorded") -> bytes:
    nonce = os.urandom(_NONCE)
    ct = AESGCM(secret).encrypt(nonce, plaintext, _aad(event_type, tenant_id, conversation_id, event_id, key_id))
    return json.dumps({
        "type": SEALED, "schema_version": 1, "event_type": event_type, "tenant_id": tenant_id, "conversation_id": conversation_id,
        "event_id": event_id, "key_id": key_id, "nonce": base64.b64encode(nonce).decode(), "ciphertext": base64.b64encode(ct).decode(),
    }, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Envelope:
    event_type: str
    tenant_id: str
    conversation_id: str
    event_id: str
    key_id: str
    nonce: bytes
    ciphertext: bytes

    def open(self, secret: bytes) -> bytes:
        try:
            return AESGCM(secret).decrypt(self.nonce, self.ciphertext,
                                          _aad(self.event_type, self.tenant_id, self.conversation_id, self.event_id, self.key_id))
        except InvalidTag:
            raise InvalidEvent(f"sealed record of event {self.event_id!r} does not open with its key {self.key_id}: "
                               "the ciphertext or its ids were altered") from None


def envelope(value: bytes) -> Envelope | None:
    """The envelope of a sealed record; None when the record is not sealed (a plain event or
    junk, which the decoder judges). A record that claims to be sealed but is malformed is an
    InvalidEvent."""
    if not value.startswith(b'{"type":"Sealed"'):
        return None
    try:
        raw = json.loads(value)
        env = Envelope(raw["event_type"], raw["tenant_id"], raw["conversation_id"], raw["event_id"], raw["key_id"],
                       base64.b64decode(raw["nonce"], validate=True), base64.b64decode(raw["ciphertext"], validate=True))
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidEvent(f"malformed sealed record ({type(exc).__name__})") from None
    if len(env.nonce) != _NONCE or not all(isinstance(x, str) for x in (env.tenant_id, env.conversation_id, env.event_id, env.key_id)):
        raise InvalidEvent("malformed sealed record (ids or nonce)")
    return env


# -- fields -------------------------------------------------------------------------------------
_FIELD = "s1:"


def seal_field(text: str, secret: bytes, key_id: str) -> str:
    nonce = os.urandom(_NONCE)
    return _FIELD + base64.b64encode(nonce + AESGCM(secret).encrypt(nonce, text.encode("utf-8"), _aad("field", key_id))).decode()


def open_field(token: str, secret: bytes, key_id: str) -> str:
    raw = base64.b64decode(token.removeprefix(_FIELD))
    return AESGCM(secret).decrypt(raw[:_NONCE], raw[_NONCE:], _aad("field", key_id)).decode("utf-8")


def is_sealed_field(value: str) -> bool:
    return value.startswith(_FIELD)


class TextSealer(Protocol):
    """Seals a turn's text for stores that cannot erase (the key is the turn's own data key, so
    forgetting the turn shreds these copies too)."""

    def seal(self, tenant_id: str, conversation_id: str, event_id: str, text: str) -> str: ...

    def seal_many(self, items: Iterable[tuple[str, str, str, str]]) -> list[str]:
        """(tenant, conversation, event_id, text) -> tokens, with one key store round trip."""
        ...

    def open_many(self, items: Iterable[tuple[str, str, str, str]]) -> list[str | None]:
        """(tenant, conversation, event_id, token) -> the text, or None when the key is destroyed."""
        ...


class KeyStoreSealer:
    """A TextSealer on a KeyStore: a turn's field is sealed with the turn's data key (made if the
    event has none yet, e.g. a record written before sealing existed)."""

    def __init__(self, keystore):
        self.keystore = keystore

    def seal(self, tenant_id: str, conversation_id: str, event_id: str, text: str) -> str:
        return self.seal_many([(tenant_id, conversation_id, event_id, text)])[0]

    def seal_many(self, items: Iterable[tuple[str, str, str, str]]) -> list[str]:
        from schemas.ports.keystore import DataKey, key_id

        items = list(items)
        kids = [key_id(t, c, e) for t, c, e, _ in items]
        held = self.keystore.put([DataKey(kid, t, c, e, new_secret()) for kid, (t, c, e, _) in zip(kids, items)]) if items else {}
        out = []
        for kid, (_, conversation_id, event_id, text) in zip(kids, items):
            if kid not in held:
                raise InvalidEvent(f"event {event_id!r} of conversation {conversation_id!r} was forgotten: its data key is destroyed")
            out.append(seal_field(text, held[kid].secret, kid))
        return out

    def open_many(self, items: Iterable[tuple[str, str, str, str]]) -> list[str | None]:
        from schemas.ports.keystore import key_id

        items = list(items)
        kids = [key_id(t, c, e) for t, c, e, _ in items]
        keys = self.keystore.get(set(kids))
        out: list[str | None] = []
        for kid, (_, _, _, token) in zip(kids, items):
            if not is_sealed_field(token):
                out.append(token)  # written before sealing: as stored
            elif kid in keys:
                out.append(open_field(token, keys[kid].secret, kid))
            else:
                out.append(None)
        return out
