"""The operations dashboard: the page (or its sign-in page), the session, and static assets.

Signing in exchanges the ops token (or an admin key) for a session cookie (services/auth.py);
the page's scripts then read /v1/ops/snapshot with it. Signing out ends the session on every
replica. The pages load nothing from elsewhere and say so in their Content-Security-Policy."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from schemas.errors import NotFound, Unauthorized
from services.auth import SESSION_COOKIE
from services.routes.deps import state
from services.routes.models import SignedIn, SignedOut
from services.routes.responses import errors

router = APIRouter()
DASHBOARD_DIR = Path(__file__).resolve().parents[1] / "ops" / "dashboard"
CSP = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'"
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Frame-Options": "DENY", "Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}
ASSET_PATTERN = r"^[A-Za-z0-9_-]{1,64}\.(js|css)$"
ASSET_TYPES = {".js": "text/javascript", ".css": "text/css"}
HTML = {200: {"content": {"text/html": {"schema": {"type": "string"}}}, "description": "The page"}}


@router.get("/dashboard", summary="Live operations dashboard (its sign-in page without a session)", response_class=Response,
            responses=HTML)
async def dashboard(request: Request):
    st = state(request)
    signed_in = st.auth.insecure or await st.auth.session(request.cookies.get(SESSION_COOKIE, "")) is not None
    page = "index.html" if signed_in else "signin.html"
    return FileResponse(DASHBOARD_DIR / page, media_type="text/html", headers=PAGE_HEADERS)


class SignIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    token: str = Field(min_length=1, max_length=512, description="The ops token (MEMSTREAM_OPS_TOKEN) or an admin key.")


def _cookie(response: Response, request: Request, value: str, max_age: int) -> None:
    """The session cookie, set and cleared with the same attributes (a browser matches them)."""
    response.set_cookie(SESSION_COOKIE, value, max_age=max_age, httponly=True, samesite="strict",
                        secure=state(request).auth.secure_cookies, path="/")


@router.post("/dashboard/session", summary="Sign the browser in: ops token or admin key -> session cookie", response_model=SignedIn,
             responses=errors(401, _401="Not the ops token or an admin key"))
async def sign_in(body: SignIn, request: Request):
    st = state(request)
    cookie = await st.auth.sign_in(body.token)
    if cookie is None:
        raise Unauthorized("not the ops token (MEMSTREAM_OPS_TOKEN) or an admin key")
    response = JSONResponse({"signed_in": True, "expires_in_seconds": int(st.auth.session_seconds)})
    _cookie(response, request, cookie, int(st.auth.session_seconds))
    return response


@router.delete("/dashboard/session", summary="Sign the browser out: the session ends on every replica", response_model=SignedOut)
async def sign_out(request: Request):
    await state(request).auth.sign_out(request.cookies.get(SESSION_COOKIE, ""))
    response = JSONResponse({"signed_in": False})
    _cookie(response, request, "", 0)
    return response


@router.get("/dashboard/assets/{name}", summary="Dashboard assets (served locally, no CDN)", response_class=Response,
            responses={200: {"content": {t: {"schema": {"type": "string"}} for t in ASSET_TYPES.values()},
                             "description": "The asset"}, **errors(404)})
async def dashboard_asset(name: str = PathParam(pattern=ASSET_PATTERN)):
    path = (DASHBOARD_DIR / name).resolve()
    if path.parent != DASHBOARD_DIR or not path.is_file():
        raise NotFound(f"no dashboard asset {name!r}")
    return FileResponse(path, media_type=ASSET_TYPES[path.suffix], headers={"Cache-Control": "no-cache"})
