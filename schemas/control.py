"""Operator control records: pause and resume one projection.

They live on their own topic (`<topic>.control`, one partition, so they are totally ordered)
next to the events, not in a side database: every process that runs projections (the embedded
`memstream serve`/`process`, each faust worker on another machine) reads the same topic, a
restart keeps a paused projection paused, and the history of operator actions is kept like any
other event.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas import safejson
from schemas.ports.views import ViewName


class ProjectionControl(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["ProjectionPaused", "ProjectionResumed"]
    schema_version: Literal[1] = 1
    projection: ViewName
    reason: str = Field("", max_length=2000)
    requested_by: str = Field("", max_length=200)
    requested_at: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))

    @property
    def paused(self) -> bool:
        return self.type == "ProjectionPaused"


def encode_control(record: ProjectionControl) -> bytes:
    return record.model_dump_json().encode("utf-8")


def decode_control(value: bytes) -> ProjectionControl | None:
    """None for anything that is not a control record (a foreign write must not wedge readers)."""
    try:
        return ProjectionControl.model_validate(safejson.loads(value.decode("utf-8")))
    except (ValueError, TypeError):  # invalid UTF-8 or JSON, JSON over the limits (deep, huge integers), or not a control record
        return None


def control_topic(topic: str) -> str:
    return topic + ".control"
