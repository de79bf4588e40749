"""The operations dashboard: the page (or its sign-in page), the session, and static assets.

Signing in exchanges the ops token (or an admin key) for a session cookie (services/auth.py);
the page's scripts then read /v1/ops/snapshot with it. The pages load nothing from elsewhere
and say so in their Content-Security-Policy."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import BaseModel, Field

from schemas.errors import NotFound, Unauthorized
from services.auth import SESSION_COOKIE
from services.routes.deps import state

router = APIRouter()
DASHBOARD_DIR = Path(__file__).resolve().parents[1] / "ops" / "dashboard"
CSP = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'"
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Frame-Options": "DENY", "Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}


@router.get("/dashboard", summary="Live operations dashboard (its sign-in page without a session)", response_class=Response)
async def dashboard(request: Request):
    st = state(request)
    signed_in = st.auth.insecure or await st.auth.session(request.cookies.get(SESSION_COOKIE, "")) is not None
    page = "index.html" if signed_in else "signin.html"
    return FileResponse(DASHBOARD_DIR / page, media_type="text/html", headers=PAGE_HEADERS)


class SignIn(BaseModel):
    token: str = Field(min_length=1, max_length=512, description="The ops token (MEMSTREAM_OPS_TOKEN) or an admin key.")


@router.post("/dashboard/session", summary="Sign the browser in: ops token or admin key -> session cookie")
async def sign_in(body: SignIn, request: Request):
    st = state(request)
    cookie = await st.auth.sign_in(body.token)
    if cookie is None:
        raise Unauthorized("not the ops token (MEMSTREAM_OPS_TOKEN) or an admin key")
    response = JSONResponse({"signed_in": True, "expires_in_seconds": int(st.auth.session_seconds)})
    response.set_cookie(SESSION_COOKIE, cookie, max_age=int(st.auth.session_seconds), httponly=True, samesite="strict",
                        secure=st.auth.secure_cookies, path="/")
    return response


@router.delete("/dashboard/session", summary="Sign the browser out")
async def sign_out():
    response = JSONResponse({"signed_in": False})
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


@router.get("/dashboard/assets/{name}", summary="Dashboard assets (served locally, no CDN)")
async def dashboard_asset(name: str):
    path = (DASHBOARD_DIR / name).resolve()
    if path.parent != DASHBOARD_DIR or not path.is_file() or path.suffix not in (".js", ".css"):
        raise NotFound(f"no dashboard asset {name!r}")
    return FileResponse(path, headers={"Cache-Control": "no-cache"})
