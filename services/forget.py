"""Forget requests, as the CLI (`memstream forget`, services/forget_cli.py) and the API
(POST /v1/forget, services/routes/forget.py) make them: the same event a producer may publish
itself on POST /v1/events, with the same authorisation (services/routes/ingest.py::authorizer).

What completes a forget, and where its bytes go, is the eraser's and the views' work
(streams/eraser.py, the view adapters); `POST /v1/wait` on the positions returned here returns
once it is complete.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

from schemas.events import ForgetRequested, ForgetScope


def scope_of(*, conversation_id: str | None = None, session_id: str | None = None, event_id: str | None = None,
             agent_id: str | None = None, occurred_before: datetime | None = None) -> ForgetScope:
    """The narrowest level the ids name: a turn (conversation + event), a session, a
    conversation, an agent, else the whole tenant; `occurred_before` narrows any of them."""
    if agent_id is not None and (conversation_id or session_id or event_id):
        raise ValueError("an agent scope is the agent's turns in every conversation: name the agent alone (or a conversation alone)")
    if event_id is not None:
        level = "turn"
    elif session_id is not None:
        level = "session"
    elif conversation_id is not None:
        level = "conversation"
    elif agent_id is not None:
        level = "agent"
    else:
        level = "tenant"
    return ForgetScope(level=level, conversation_id=conversation_id, session_id=session_id, event_id=event_id, agent_id=agent_id,
                       occurred_before=occurred_before)


def forget_request(tenant_id: str, scope: ForgetScope, *, reason: str | None = None, requested_by: str | None = None) -> ForgetRequested:
    return ForgetRequested(event_id=f"forget-{uuid.uuid4().hex}", tenant_id=tenant_id, scope=scope, requested_at=datetime.now(timezone.utc),
                           reason=reason, requested_by=requested_by)
