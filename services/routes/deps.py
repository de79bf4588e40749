"""FastAPI dependencies shared by the routes: the app's state and the caller."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from schemas.security import Principal, Role
from services.auth import require, require_ops


def state(request: Request) -> Any:
    return request.app.state.memstream


def caller(role: Role):
    """A dependency: the request's principal, which must hold `role`."""

    async def dependency(request: Request) -> Principal:
        principal = await state(request).auth.principal(request)
        require(principal, role)
        return principal

    return Depends(dependency)


async def _ops(request: Request) -> Principal:
    principal = await state(request).auth.principal(request, ops=True, session=True)
    require_ops(principal)
    return principal


async def _ops_bearer(request: Request) -> Principal:
    principal = await state(request).auth.principal(request, ops=True)
    require_ops(principal)
    return principal


Reader = Annotated[Principal, caller("reader")]
Writer = Annotated[Principal, caller("writer")]
Admin = Annotated[Principal, caller("admin")]
Ops = Annotated[Principal, Depends(_ops)]  # the ops token, an admin key, or a dashboard session
OpsBearer = Annotated[Principal, Depends(_ops_bearer)]  # the ops token or an admin key, as a bearer
