"""Who is calling and what they may do: bearer keys, roles, tenants, rate limits, the ops token
and the dashboard's session cookie. The key model is schemas/security.py; the key ring that
knows every key is streams/keys.py.

Every endpoint but /healthz, /openapi.json, the dashboard's static assets and its sign-in page
needs `Authorization: Bearer <key>`. A missing, malformed, unknown, revoked or expired key gets
one and the same 401, whatever the request names (no tenant probing). A known key whose role or
tenant does not allow the request gets 403.

The ops token (`MEMSTREAM_OPS_TOKEN`) is for machines and people watching the service: it reads
/metrics and the ops snapshot, and signs a browser into /dashboard. The dashboard session is a
cookie (HttpOnly, SameSite=Strict, Secure under TLS) holding an expiry, a random session id and
an HMAC keyed by the ops token, so every replica that shares the token accepts it and changing
the token ends every session; signed in with an admin key instead, the session names that key
and ends when the key is revoked. Signing out ends the session on the server: a `SessionEnded`
record on the control topic, which every replica applies within the key ring's refresh bound
(as it applies a key revocation). The session opens the dashboard and its snapshot only;
/metrics takes the ops token or an admin key as a bearer.

Rate limits are token buckets per key and per replica (N replicas admit up to N times the rate).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from fastapi import Request

from schemas.errors import Forbidden, RateLimited, Unauthorized
from schemas.security import Principal, Role
from streams.keys import KeyRing

UNAUTHORIZED = "missing or unknown API key: send `Authorization: Bearer <key>` (memstream keys create)"
OPS_PRINCIPAL = Principal(key_id="ops-token", role="reader", name="MEMSTREAM_OPS_TOKEN")
INSECURE_PRINCIPAL = Principal(key_id="insecure-no-auth", role="admin", name="--insecure-no-auth")
SESSION_COOKIE = "memstream_session"


class TokenBuckets:
    """`rate` requests per second per key, bursts up to `burst`; rate <= 0 turns limiting off."""

    def __init__(self, rate: float, burst: float):
        self.rate, self.burst = rate, max(burst, 1.0)
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """0 when the request may go; else the seconds until a token is available."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate


@dataclass
class Authenticator:
    keyring: KeyRing | None          # None: --insecure-no-auth
    ops_token: str | None
    buckets: TokenBuckets
    secure_cookies: bool = False
    session_seconds: float = 12 * 3600

    def __post_init__(self):
        seed = self.ops_token.encode() if self.ops_token else secrets.token_bytes(32)  # no token: sessions of this process only
        self._session_key = hashlib.sha256(b"memstream dashboard session\0" + seed).digest()

    @property
    def insecure(self) -> bool:
        return self.keyring is None

    # -- bearer keys ------------------------------------------------------------------------------
    async def principal(self, request: Request, *, ops: bool = False, session: bool = False) -> Principal:
        """The request's caller; `ops=True` also admits the ops token, `session=True` a dashboard
        session cookie."""
        if self.insecure:
            return INSECURE_PRINCIPAL
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        bearer = value.strip() if scheme.lower() == "bearer" else ""
        if ops and bearer and self.ops_token and hmac.compare_digest(bearer.encode(), self.ops_token.encode()):
            return OPS_PRINCIPAL
        principal = await self.keyring.authenticate(bearer) if bearer else None
        if principal is None and session and not bearer:
            principal = await self.session(request.cookies.get(SESSION_COOKIE, ""))
        if principal is None:
            raise Unauthorized(UNAUTHORIZED)
        wait = self.buckets.take(principal.key_id)
        if wait > 0:
            raise RateLimited(f"key {principal.key_id} is over its rate limit ({self.buckets.rate:g} requests/s per key on this "
                              f"replica); retry after {math.ceil(wait)} s", retry_after=math.ceil(wait))
        return principal

    # -- dashboard sessions -----------------------------------------------------------------------
    def _sign(self, payload: str) -> str:
        return hmac.new(self._session_key, payload.encode(), hashlib.sha256).hexdigest()

    async def sign_in(self, credential: str) -> str | None:
        """A session cookie value for the ops token or an admin key, else None."""
        if self.ops_token and hmac.compare_digest(credential.encode(), self.ops_token.encode()):
            subject = "ops"
        else:
            principal = await self.keyring.authenticate(credential) if self.keyring else None
            if principal is None or not principal.is_admin:
                return None
            subject = principal.key_id
        payload = f"{int(time.time() + self.session_seconds)}.{subject}.{secrets.token_hex(16)}"
        return f"{payload}.{self._sign(payload)}"

    def _verified(self, cookie: str) -> tuple[int, str, str] | None:
        """(expiry, subject, session id) of a cookie this service signed and that has not expired."""
        parts = cookie.split(".")
        if len(parts) != 4 or not parts[0].isascii() or not parts[0].isdigit() or len(parts[0]) > 12:
            return None
        expiry, subject, session_id, signature = parts
        if not (subject and session_id) or not hmac.compare_digest(self._sign(f"{expiry}.{subject}.{session_id}"), signature):
            return None
        return (int(expiry), subject, session_id) if int(expiry) >= time.time() else None

    async def session(self, cookie: str) -> Principal | None:
        verified = self._verified(cookie)
        if verified is None or self.keyring is None:
            return None
        _, subject, session_id = verified
        await self.keyring.refresh()
        if self.keyring.session_ended(session_id):
            return None
        if subject == "ops":
            return OPS_PRINCIPAL
        state = self.keyring.keys.get(subject)
        if state is None or not state.active(datetime.now(timezone.utc)):
            return None  # the key that signed in was revoked: so is its session
        return Principal(key_id=state.key_id, role=state.created.role, tenant_id=state.created.tenant_id, name=state.created.name)

    async def sign_out(self, cookie: str) -> None:
        """End the cookie's session on every replica (nothing to do for one that is not valid)."""
        verified = self._verified(cookie)
        if verified is not None and self.keyring is not None:
            expiry, _, session_id = verified
            await self.keyring.end_session(session_id, datetime.fromtimestamp(expiry, timezone.utc))


# -- what a principal may do --------------------------------------------------------------------
def require(principal: Principal, role: Role) -> None:
    if not principal.may(role):
        raise Forbidden(f"this needs a {role} key; key {principal.key_id} is a {principal.role} key")


def require_ops(principal: Principal) -> None:
    if not (principal.is_admin or principal.key_id == OPS_PRINCIPAL.key_id):
        raise Forbidden(f"this needs an admin key or the ops token (MEMSTREAM_OPS_TOKEN); key {principal.key_id} is a {principal.role} key")


def tenant_for(principal: Principal, requested: str | None) -> str:
    """The tenant a request acts on: the one named, which must be the key's own, or the key's
    own when none is named. Admin keys must name one."""
    if requested is None:
        if principal.tenant_id is None:
            raise Forbidden("an admin key belongs to no tenant: name the tenant (tenant_id)")
        return principal.tenant_id
    if not principal.may_access(requested):
        raise Forbidden(f"key {principal.key_id} belongs to another tenant than {requested!r}")
    return requested
