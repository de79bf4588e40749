"""Key management, shared by the CLI (`memstream keys …`, services/keys_cli.py) and the admin
HTTP endpoints (services/routes/keys.py). Each change is one record appended to the control
topic; the answer carries its `control_offset`, which POST /v1/wait accepts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from pydantic import ValidationError

from schemas.errors import Conflict, InvalidRequest, NotFound
from schemas.events import field_errors
from schemas.security import KeyCreated, KeyRevoked, KeyRotated, Role, digest, new_key_id, new_secret, token
from streams.keys import KeyRing

DEFAULT_GRACE = timedelta(hours=24)  # how long a rotated key's previous secret keeps working


@dataclass(frozen=True)
class KeyChange:
    info: dict
    control_offset: int
    key: str | None = None  # the secret key, only when one was just made (shown once)

    def as_dict(self) -> dict:
        out = {**self.info, "control_offset": self.control_offset}
        if self.key is not None:
            out["key"] = self.key
        return out


def _info(ring: KeyRing, key_id: str) -> dict:
    return next(k for k in ring.listing() if k["key_id"] == key_id)


async def create(ring: KeyRing, role: Role, tenant_id: str | None, name: str = "", by: str = "") -> KeyChange:
    if (role == "admin") != (tenant_id is None):
        raise InvalidRequest("an admin key has no tenant; a reader or writer key needs exactly one (--tenant)")
    key_id, secret = new_key_id(), new_secret()
    try:
        record = KeyCreated(key_id=key_id, tenant_id=tenant_id, role=role, name=name, secret_sha256=digest(secret), by=by)
    except ValidationError as exc:
        errors = field_errors(exc)
        raise InvalidRequest("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors), errors) from None
    offset = await ring.append(record)
    return KeyChange(_info(ring, key_id), offset, token(key_id, secret))


async def _known(ring: KeyRing, key_id: str):
    await ring.refresh(force=True)
    state = ring.keys.get(key_id)
    if state is None:
        raise NotFound(f"no key {key_id!r} (memstream keys list)")
    return state


async def revoke(ring: KeyRing, key_id: str, by: str = "") -> KeyChange:
    await _known(ring, key_id)
    offset = await ring.append(KeyRevoked(key_id=key_id, by=by))
    return KeyChange(_info(ring, key_id), offset)


async def rotate(ring: KeyRing, key_id: str, grace: timedelta = DEFAULT_GRACE, by: str = "") -> KeyChange:
    state = await _known(ring, key_id)
    if state.revoked_at is not None:
        raise Conflict(f"key {key_id} is revoked; create a new one instead")
    secret = new_secret()
    until = datetime.now(timezone.utc) + max(grace, timedelta(0))
    offset = await ring.append(KeyRotated(key_id=key_id, secret_sha256=digest(secret), previous_valid_until=until, by=by))
    return KeyChange(_info(ring, key_id), offset, token(key_id, secret))
