"""Projections on faust-streaming: `memstream worker --projection NAME` runs one faust app (one
consumer group, `memstream.<view>`) whose agent feeds batches of records to the *same*
projection logic and runner steps as the embedded mode (streams/runner.py); `memstream worker`
runs one app (`memstream.workers`) with one agent per projection. Faust is only the shell:
partition assignment, rebalances, batching, acks.

Delivery: the agent writes the view and its positions (store.apply) before it yields, and faust
commits an offset only after the agent has processed the event, so commits always follow the
view writes. After a rebalance the new owner may be handed records the view already holds (the
group commit lags the view's positions by up to one commit interval): the runner drops every
record below the view's own position for that partition, so nothing is written twice and
nothing is skipped.

Pause/resume (streams/control.py): a paused view's agent acks its batches without applying
them; after `resume` the catch-up timer reads the gap from the log.

A timer also catches the view up straight from the log whenever it lags and faust delivers
nothing (e.g. the group's commits ran ahead of a freshly switched generation): positions, not
the group, are the truth. It reads only the partitions the group assigned to this worker, and a
revocation waits for its batch in flight: two members applying one partition at once could
interleave their writes (a window derived from the session as one saw it overwriting the other's
newer one). Faust itself waits for the agents' batches before it revokes.

Source topics are created by memstream (retention forever, broker append time) before the app
starts: faust ignores a source topic that does not exist yet when the worker starts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from pathlib import Path

from schemas import faults
from schemas.ports.event_log import LogRecord
from schemas.ports.views import ViewName
from streams.pipeline import Pipeline

log = logging.getLogger(__name__)


def to_record(event) -> LogRecord:
    m = event.message
    key = m.key.decode("utf-8", "replace") if isinstance(m.key, (bytes, bytearray)) else m.key
    headers = tuple((k, v if isinstance(v, bytes) else str(v).encode()) for k, v in (m.headers or []))
    value = event.value if isinstance(event.value, (bytes, bytearray)) else m.value
    return LogRecord(m.topic, m.partition, m.offset, key, bytes(value), float(m.timestamp), headers)


def build_app(pipeline: Pipeline, views: tuple[ViewName, ...], bootstrap: str, *, batch_size: int = 256, within: float = 0.5,
              session_timeout: float = 10.0, heartbeat: float = 1.0, rebalance_timeout: float = 5.0, catch_up_every: float = 2.0,
              ready_file: str | None = None, on_started=None, credentials=None):
    """A faust app with one agent per view. The pipeline must use the Kafka event log and be
    built for exactly these views (the app starts it). `on_started(app)` runs once the views
    are open. `credentials`: faust broker credentials (infra/log/kafka_security.py)."""
    import faust

    app = faust.App(
        f"memstream.{views[0]}" if len(views) == 1 else "memstream.workers",
        broker=[f"aiokafka://{b}" for b in bootstrap.split(",")],
        broker_credentials=credentials,
        store="memory://",
        web_enabled=False,
        datadir=tempfile.mkdtemp(prefix="memstream-faust-"),
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=session_timeout,
        broker_heartbeat_interval=heartbeat,
        broker_rebalance_timeout=rebalance_timeout,
        topic_allow_declare=False,  # memstream creates its topics with their retention settings
        topic_disable_leader=True,
    )
    source = app.topic(pipeline.config.topic, key_serializer="raw", value_serializer="raw")
    ready = asyncio.Event()
    owned: set[int] = set()  # the source topic's partitions the group assigned to this worker
    fence = asyncio.Lock()  # held by a catch-up batch; a revocation (and the shutdown) waits for it

    @app.on_partitions_assigned.connect
    async def _assigned(app, assigned, **_) -> None:  # noqa: ARG001
        async with fence:
            owned.clear()
            owned.update(tp.partition for tp in assigned if tp.topic == pipeline.config.topic)

    @app.on_partitions_revoked.connect
    async def _revoked(app, revoked, **_) -> None:  # noqa: ARG001
        async with fence:
            owned.difference_update(tp.partition for tp in revoked if tp.topic == pipeline.config.topic)

    @app.on_before_shutdown.connect
    async def _close(app, **_) -> None:  # noqa: ARG001
        async with fence:  # (faust sends no revocation when it stops)
            owned.clear()
            await pipeline.close()

    @app.task
    async def open_views() -> None:
        await pipeline.start()
        if on_started is not None:  # e.g. the CLI's metrics endpoint and lag sampler
            on_started(app)
        ready.set()
        if ready_file:  # tells a supervisor (or a benchmark) that models are loaded and views open
            Path(ready_file).write_text(str(os.getpid()))

    def agent_for(view: ViewName):
        async def project(stream):
            await ready.wait()
            async for events in stream.take_events(batch_size, within=within):
                await pipeline.control.refresh()
                if pipeline.control.paused(view):
                    # Acked but not applied: the view's positions stay put, and the catch-up
                    # timer reads the gap from the log after `resume` (positions are the truth).
                    # Blocking here instead would stall the other agents sharing the consumer.
                    continue
                records = [to_record(e) for e in events]
                runner = await pipeline.live_runner(view)
                runner.commit_group = False  # faust commits the group, after this batch is written
                try:
                    # Never wait out a store outage here: the agents share one consumer, so one
                    # blocked agent would stall the others. The records stay on the log (positions
                    # are the truth) and the catch-up timer reads them once the store is back.
                    if await runner.try_process(records):
                        faults.hit("position-written")  # crash tests (schemas/faults.py): written, not acked to Kafka
                except Exception:  # noqa: BLE001 - the runner already isolates bad records; keep the agent alive
                    log.exception("view=%s batch failed; it will be redelivered", view)
                    raise

        project.__name__ = project.__qualname__ = f"project_{view}"
        return app.agent(source, name=f"project_{view}", concurrency=1)(project)

    for view in views:
        agent_for(view)

    @app.timer(interval=catch_up_every)
    async def catch_up() -> None:
        if not ready.is_set():
            return
        # An exception escaping a faust timer ends the worker: each part logs its failure and is
        # tried again at the next tick (a store or the broker briefly away costs lag, not the process).
        for what, part in (("catch-up", _catch_up_views), ("intake relay", _relay), ("eraser", _erase), ("retention sweep", _sweep)):
            try:
                await part()
            except Exception:  # noqa: BLE001 - see above
                log.exception("%s failed; retrying at the next catch-up", what)

    async def _catch_up_views() -> None:
        await pipeline.control.refresh()
        for view in views:  # one view's trouble never keeps the others from catching up
            if pipeline.control.paused(view):
                continue
            try:
                runner = await pipeline.live_runner(view)
                runner.commit_group = False
                while True:  # one batch per fence hold, so a rebalance waits for one batch at most
                    async with fence:
                        result = await runner.try_step(partitions=set(owned)) if owned else None
                    if result is None or not result.records:  # (an outage: the next tick)
                        break
                await runner.erase_if_due()  # deferred erasure (streams/runner.py)
            except Exception:  # noqa: BLE001 - logged, tried again at the next tick
                log.exception("view=%s catch-up failed; retrying at the next catch-up", view)

    async def _relay() -> None:
        if pipeline.intake is not None:  # foreign producers' plain events, sealed onto the event topic (streams/intake.py)
            while await pipeline.intake.step():
                pass

    async def _erase() -> None:
        if pipeline.eraser is not None:  # forgets: destroy the keys of what they cover (streams/eraser.py)
            while await pipeline.eraser.step():
                pass

    async def _sweep() -> None:
        if pipeline.retention is not None:  # tenants' retention: forget what it no longer keeps (streams/retention.py)
            await pipeline.retention.step()

    return app


def run_worker(pipeline: Pipeline, views: tuple[ViewName, ...], bootstrap: str, loglevel: str = "WARNING", **kwargs) -> None:
    """Run until SIGTERM/SIGINT (faust's graceful shutdown), then close the views."""
    import faust

    app = build_app(pipeline, views, bootstrap, **kwargs)  # (the app closes the pipeline when it stops)
    faust.Worker(app, loglevel=loglevel, quiet=True).execute_from_commandline()

