"""API keys and roles: who may do what, and the records that change it.

A key is `msk_<key_id>_<secret>`: `key_id` (16 hex characters) is public — listed, revoked and
rotated by it, and written in logs and the audit trail; `secret` is 256 random bits, shown once
when the key is made and stored nowhere, only its SHA-256 (a slow password hash adds nothing for
a 256-bit random secret, and a fast one keeps authentication off the request's critical path).
Verification compares digests in constant time and does the same work for an unknown key id,
so a caller learns nothing from timing either.

Key changes are records on the control topic (`<topic>.control`, one partition, totally
ordered), like pause/resume: every process that serves the API reads the same records, so a
revocation reaches every replica, and the history of key changes is kept like any other event.
Roles:

- `reader`: search, answer, wait and status, for its own tenant;
- `writer`: reader + publish events and forget inside its tenant (not the whole tenant);
- `admin`: every tenant, tenant-wide forget, pause/resume, dead letters, key management,
  metrics. An admin key belongs to no tenant; a reader or writer key to exactly one.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import datetime, timezone
from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from schemas import safejson
from schemas.rules import FROM_LOG, TENANT_PATTERN, Name

Role = Literal["reader", "writer", "admin"]
ROLES: tuple[Role, ...] = ("reader", "writer", "admin")
KEY_ID_PATTERN = r"^[0-9a-f]{16}$"
_TOKEN = re.compile(r"^msk_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
_DUMMY_DIGEST = hashlib.sha256(b"memstream: no such key").hexdigest()


def _now() -> datetime:
    return datetime.now(timezone.utc)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1] = 1
    key_id: str = Field(pattern=KEY_ID_PATTERN)
    at: datetime = Field(default_factory=_now)
    by: str = Field("", max_length=200, description="Who made the change: an admin key id, or 'cli:<user>@<host>'.")


class KeyCreated(_Record):
    type: Literal["KeyCreated"] = "KeyCreated"
    tenant_id: str | None = Field(None, pattern=TENANT_PATTERN)
    role: Role
    name: Name = Field("", max_length=200)
    secret_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @model_validator(mode="after")
    def _tenant_matches_role(self) -> "KeyCreated":
        if (self.role == "admin") != (self.tenant_id is None):
            raise ValueError("an admin key has no tenant; a reader or writer key has exactly one")
        return self


class KeyRevoked(_Record):
    type: Literal["KeyRevoked"] = "KeyRevoked"


class KeyRotated(_Record):
    """A new secret for the key; the previous one stays valid until `previous_valid_until`."""

    type: Literal["KeyRotated"] = "KeyRotated"
    secret_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    previous_valid_until: datetime


KeyRecord = Union[KeyCreated, KeyRevoked, KeyRotated]
KEY_RECORD_TYPES = ("KeyCreated", "KeyRevoked", "KeyRotated")
_KEY_ADAPTER: TypeAdapter = TypeAdapter(Union[KeyCreated, KeyRevoked, KeyRotated])


def encode_key_record(record: KeyRecord) -> bytes:
    return record.model_dump_json().encode("utf-8")


def decode_key_record(value: bytes) -> KeyRecord | None:
    """None for anything that is not a key record (pause/resume records share the topic; a
    foreign write must not wedge readers)."""
    try:
        raw = safejson.loads(value.decode("utf-8"))
    except ValueError:  # invalid UTF-8 or JSON, or JSON over the limits (deep, huge integers: json.loads would raise other errors)
        return None
    if not isinstance(raw, dict) or raw.get("type") not in KEY_RECORD_TYPES:
        return None
    try:
        return _KEY_ADAPTER.validate_python(raw, context=FROM_LOG)  # the rules a record was written under
    except ValidationError:
        return None


class SessionEnded(BaseModel):
    """A dashboard session signed out. Every process that serves the API folds these from the
    control topic like key changes, so the cookie stops working on every replica within the key
    ring's refresh bound; the record matters only until the session would have expired anyway."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["SessionEnded"] = "SessionEnded"
    schema_version: Literal[1] = 1
    session_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    expires_at: datetime
    at: datetime = Field(default_factory=_now)


def decode_session_record(value: bytes) -> SessionEnded | None:
    """None for anything that is not a session record (the control topic holds other records too)."""
    try:
        raw = safejson.loads(value.decode("utf-8"))
    except ValueError:
        return None
    if not isinstance(raw, dict) or raw.get("type") != "SessionEnded":
        return None
    try:
        return SessionEnded.model_validate(raw)
    except ValidationError:
        return None


# -- secrets ------------------------------------------------------------------------------------
def new_key_id() -> str:
    return secrets.token_hex(8)


def new_secret() -> str:
    return secrets.token_urlsafe(32)  # 256 bits, 43 characters


def token(key_id: str, secret: str) -> str:
    return f"msk_{key_id}_{secret}"


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def parse_token(value: str) -> tuple[str, str] | None:
    """(key_id, secret) of a well-formed key, else None."""
    m = _TOKEN.fullmatch(value.strip()) if value else None
    return (m.group(1), m.group(2)) if m else None


def secret_matches(secret: str, digests: list[str]) -> bool:
    """Constant-time: every candidate digest is compared, and an empty list costs the same as one."""
    candidate = digest(secret)
    ok = False
    for d in digests or [_DUMMY_DIGEST]:
        ok |= hmac.compare_digest(candidate, d)
    return ok and bool(digests)


# -- who is calling -----------------------------------------------------------------------------
class Principal(BaseModel):
    """The caller of one request, as its key says."""

    model_config = ConfigDict(frozen=True)

    key_id: str
    role: Role
    tenant_id: str | None = None
    name: str = ""

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def may(self, role: Role) -> bool:
        return ROLES.index(self.role) >= ROLES.index(role)

    def may_access(self, tenant_id: str) -> bool:
        return self.is_admin or self.tenant_id == tenant_id


INSECURE = Principal(key_id="insecure-no-auth", role="admin", name="--insecure-no-auth")
OPS = Principal(key_id="ops-token", role="reader", name="MEMSTREAM_OPS_TOKEN")
