"""The HTTP API fuzzed from its own OpenAPI document (schemathesis), once per role with a valid
key (reader, writer, admin) and once with no key at all.

The served /openapi.json is loaded into schemathesis; every operation gets EXAMPLES generated
requests (positive mode: what the document says is valid, which is what reaches the code behind
validation), and each generated request is sent four times — with the reader's, the writer's
and the admin's key and with none — through the ASGI app in-process (a TestClient, lifespan
running, no in-process projections; the views hold the sample conversation, processed before
the app starts, so searches run over real data). Generating once and sending per role keeps the
run affordable: generation costs as much as a request. Checks on every answer:

- no 5xx (schemathesis' `not_a_server_error`; the one exception is /v1/wait's documented 504
  when the positions are not reached, which must then be a `timeout` in the error shape);
- every 4xx carries the API's one error shape `{"error": {"code", "message", "details", ...}}`;
- an operation the role may not call never reaches its handler (401 without a key, 403 with one);
- with a valid key, at least 80 % of the requests to each operation the role may call reach the
  handler: they do not stop at 401/403, at the edge guard, or at request validation. Generated
  from the document alone, requests would mostly name other tenants and other projections, so
  schemathesis hooks (flatmap_body / flatmap_query / flatmap_path_parameters) set `tenant_id` to
  the key's own tenant or drop it most of the time, bound timestamps to the accepted range, and
  fill path parameters with real projection names, key ids and asset names; the rest stays as
  generated.

Then NEGATIVE_EXAMPLES requests per operation that takes input are generated in negative mode
(what the document says is invalid) and sent with the admin key: no 5xx, the error shape.

Whether a request reached its handler is observed, not inferred from status codes (handlers
answer 401, 403 and 422 themselves too): see `Observer`. The figures (requests, status histogram,
share that reached the handler, per role and operation, time) are printed at the end. Rate
limits are off (they have their own tests); /v1/wait's timeout is cut to 20 ms.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings as hsettings, strategies as st  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402
from schemathesis.hooks import HookDispatcher, HookScope  # noqa: E402

from infra.settings import Settings  # noqa: E402
from schemas.ports.reader import ReaderReply  # noqa: E402
from schemas.ports.views import VIEW_NAMES  # noqa: E402
from services.routes.dashboard import DASHBOARD_DIR  # noqa: E402
from tests.e2e.helpers import bearer, make_key, make_pipeline, publish, registry_with, sample_items  # noqa: E402

pytestmark = pytest.mark.e2e

EXAMPLES = 200          # generated requests per operation, each sent once per role
NEGATIVE_EXAMPLES = 50  # schema-violating requests per operation that takes input, with the admin key
MIN_REACHED = 0.80      # share of a role's requests to an operation it may call that reach the handler
ROLES = ("reader", "writer", "admin", "none")
TENANT = "demo"         # the sample conversation's tenant: the reader's and writer's keys belong to it
OTHER_TENANT = "fuzz-other"
CONVERSATION, SESSIONS, AGENTS = "lisbon-trip", ("s1", "s2"), ("ada", "planner")

OPEN = {"GET /healthz", "GET /dashboard", "POST /dashboard/session", "DELETE /dashboard/session", "GET /dashboard/assets/{name}"}
READER = {"POST /v1/wait", "GET /v1/status", "POST /v1/search", "POST /v1/answer", "GET /v1/turns", "GET /v1/turns/{event_id}",
          "GET /v1/turns/{event_id}/history"}
WRITER = READER | {"POST /v1/events", "POST /v1/forget", "GET /v1/export"}
ADMIN = WRITER | {"GET /metrics", "GET /v1/ops/snapshot", "GET /v1/dead-letters", "POST /v1/admin/projections/{name}/pause",
                  "POST /v1/admin/projections/{name}/resume", "GET /v1/admin/keys", "POST /v1/admin/keys",
                  "POST /v1/admin/keys/{key_id}/revoke", "POST /v1/admin/keys/{key_id}/rotate", "GET /v1/admin/audit"}
OPERATIONS = sorted(OPEN | ADMIN)
SAMPLE_EVENT_IDS = [item["event_id"] for item in sample_items()[:4]]
MAY_CALL = {"none": OPEN, "reader": OPEN | READER, "writer": OPEN | WRITER, "admin": OPEN | ADMIN}


class EchoReader:
    """The reader (the one LLM call) as a deterministic double: /v1/answer then runs its search,
    the reader call and answer calibration instead of stopping at 'no reader configured'."""

    model = "echo"

    def answer(self, question: str, evidence_lines: list[str]) -> ReaderReply:
        text = (evidence_lines[0] if evidence_lines else question)[:200]
        return ReaderReply(text=text, model=self.model, prompt_tokens=len(evidence_lines), completion_tokens=1)

    def close(self) -> None:
        pass


class Observer:
    """Where the request in flight got to (requests are sent one at a time): past the edge guard
    (size, media type, safe JSON), past the role check (the key may call the operation), past
    request validation. A request that got past all three reached its handler (open operations
    have no role check). Observed with a probe just inside the edge guard, the role checks of
    services/routes/deps.py wrapped, and the request-validation error handler wrapped."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.past_edge = self.authorized = self.invalid = False

    def reached(self, open_operation: bool) -> bool:
        return self.past_edge and (open_operation or self.authorized) and not self.invalid

    def probe(self, app):
        async def probe(scope, receive, send):
            if scope["type"] == "http":
                self.past_edge = True
            await app(scope, receive, send)

        return probe

    def watch(self, check):
        def watched(*args, **kwargs):
            result = check(*args, **kwargs)  # raises Forbidden when the key may not
            self.authorized = True
            return result

        return watched

    def watch_validation(self, handler):
        async def watched(request, exc):
            self.invalid = True
            return await handler(request, exc)

        return watched


@dataclass
class Figures:
    """Per (role, operation): requests sent, status histogram, how many reached the handler."""

    sent: Counter = field(default_factory=Counter)
    reached: Counter = field(default_factory=Counter)
    statuses: dict = field(default_factory=lambda: defaultdict(Counter))
    seconds: dict = field(default_factory=dict)   # per operation, all roles, generation included


@dataclass
class Stack:
    client: object
    keys: dict
    victims: dict
    operations: dict
    observer: Observer
    figures: Figures


@pytest.fixture(scope="module")
def stack(tmp_path_factory, models, request):
    from fastapi.exceptions import RequestValidationError
    from fastapi.testclient import TestClient
    from starlette.middleware import Middleware

    from services.api import create_app
    from services.routes import deps

    data_dir = tmp_path_factory.mktemp("fuzz") / "data"
    overrides = {"api": {"rate_limit_per_second": 0}}  # 15,000 requests from three keys: rate limits have their own test

    async def ingest_sample():
        pipeline, _ = make_pipeline(data_dir, models, **overrides)
        await pipeline.start()
        try:
            await publish(pipeline, sample_items())
            await pipeline.process_until_caught_up()
        finally:
            await pipeline.close()

    asyncio.run(ingest_sample())
    settings = Settings.load(data_dir=data_dir, **overrides)
    keys = {role: make_key(settings, role, TENANT, f"fuzz {role}") for role in ("reader", "writer")}
    keys["admin"] = make_key(settings, "admin", name="fuzz admin")
    # The admin run revokes and rotates these (never the keys the run itself uses).
    victims = {action: make_key(settings, "writer", OTHER_TENANT, f"fuzz victim: {action}")["key_id"] for action in ("revoke", "rotate")}
    observer = Observer()
    app = create_app(settings, registry=registry_with(settings, models), process=False)
    app.user_middleware.append(Middleware(observer.probe))  # innermost: sees only what the edge guard let through
    app.exception_handlers[RequestValidationError] = observer.watch_validation(app.exception_handlers[RequestValidationError])
    with pytest.MonkeyPatch.context() as mp, TestClient(app) as client:
        mp.setattr(deps, "require", observer.watch(deps.require))
        mp.setattr(deps, "require_ops", observer.watch(deps.require_ops))
        client.app.state.memstream.reader = EchoReader()
        schema = schemathesis.openapi.from_dict(client.get("/openapi.json").json())
        operations = {f"{op.method.upper()} {op.path}": op for op in (r.ok() for r in schema.get_all_operations())}
        figures = Figures()
        yield Stack(client, keys, victims, operations, observer, figures)
    report(request, figures)


# -- hooks: requests a handler can act on ---------------------------------------------------------
def in_range_time() -> st.SearchStrategy[str]:
    base = datetime(2026, 3, 1, tzinfo=timezone.utc)
    return st.integers(-400 * 86400, 400 * 86400).map(lambda s: (base + timedelta(seconds=s)).isoformat())


# 'own': the keys' tenant (the sample's, which the admin names too), 'drop': omit it (the key's
# tenant is the default; an admin key must name one, and its handler says so), 'keep': as generated.
TENANT_CHOICE = st.sampled_from(["own"] * 5 + ["drop"] * 4 + ["keep"])


def with_tenant(value: dict, choice: str) -> dict:
    value = dict(value)
    if choice == "own":
        value["tenant_id"] = TENANT
    elif choice == "drop":
        value.pop("tenant_id", None)
    return value


def optional(values: list, keep: int = 1) -> st.SearchStrategy:
    """One of `values`, None (omit the field) or, `keep` times in 8, 'keep' (as generated)."""
    return st.one_of(st.sampled_from(values), st.none(), st.sampled_from(["keep"] * keep + [None] * (8 - keep)))


def optional_time() -> st.SearchStrategy:
    """A time in the accepted range, None (omit it) or, 1 time in 16, 'keep' (as generated)."""
    return st.one_of(in_range_time(), st.none(), st.sampled_from(["keep"] + [None] * 7))


def _search(body: dict, c: dict) -> dict:
    out = with_tenant(body, c.pop("tenant"))
    for key, value in c.items():
        if value is None:
            out.pop(key, None)
        elif value != "keep":
            out[key] = value
    return out


def _events(body, choices: list[str], times: list[str]):
    def fix(item, i):
        if not isinstance(item, dict):
            return item
        item = with_tenant(item, choices[i % len(choices)])
        when = times[i % len(times)]
        for key in ("occurred_at", "requested_at"):
            if key in item and when != "keep":
                item[key] = when
        return item

    if isinstance(body, list):
        return [fix(x, i) for i, x in enumerate(body)]
    if isinstance(body, dict) and isinstance(body.get("events"), list):
        return {**body, "events": [fix(x, i) for i, x in enumerate(body["events"])]}
    return fix(body, 0)


def _wait(body: dict, positions: dict, how: str, control: str | None) -> dict:
    out = dict(body)
    if how == "empty":
        out["positions"] = {}
    elif how == "fix":
        out["positions"] = positions  # partitions that exist; offsets the views may or may not have reached
    if control is None:
        out.pop("control_offset", None)
    given_timeout = out.get("timeout_seconds", 10.0)  # a wait answers within 20 ms, whatever was asked
    if isinstance(given_timeout, (int, float)) and not isinstance(given_timeout, bool):
        out["timeout_seconds"] = min(given_timeout, 0.02)
    return out


def _forget(body: dict, tenant: str, how: str) -> dict:
    """A forget the handler acts on, never of the sample conversation the other operations read:
    'scratch' points it at a conversation (or agent) nobody wrote; 'keep' keeps the generated ids
    (which name nothing), and a tenant-wide one only reaches turns older than 2000."""
    out = with_tenant(body, tenant)
    if how == "scratch":
        if out.get("agent_id") is not None:
            out["agent_id"] = "fuzz-scratch-agent"
        else:
            out["conversation_id"] = "fuzz-scratch"
    elif out.get("conversation_id") is None and out.get("agent_id") is None:
        out["occurred_before"] = "2000-01-01T00:00:00+00:00"
    return out


def _new_key(body: dict, how: str) -> dict:
    if how == "keep" or not isinstance(body.get("role"), str):
        return body
    out = {k: v for k, v in body.items() if k != "tenant_id"}
    return out if body["role"] == "admin" else {**out, "tenant_id": OTHER_TENANT}


def fuzz_hooks(victims: dict, admin_key: str) -> HookDispatcher:
    hooks = HookDispatcher(scope=HookScope.TEST)
    assets = sorted(p.name for p in DASHBOARD_DIR.iterdir())

    def flatmap_body(context, body):
        op = f"{context.operation.method.upper()} {context.operation.path}"
        if op in ("POST /v1/search", "POST /v1/answer") and isinstance(body, dict):
            return st.fixed_dictionaries({
                "tenant": TENANT_CHOICE, "conversation_id": optional([CONVERSATION]), "session_id": optional(list(SESSIONS)),
                "agent_id": optional(list(AGENTS)), "since": optional_time(), "until": optional_time(), "as_of": optional_time(),
            }).map(lambda c: _search(body, c))
        if op == "POST /v1/events":
            return st.tuples(st.lists(TENANT_CHOICE, min_size=1, max_size=4),
                             st.lists(st.one_of(in_range_time(), st.just("keep")), min_size=1, max_size=4)).map(lambda c: _events(body, *c))
        if op == "POST /v1/wait" and isinstance(body, dict):
            return st.tuples(st.dictionaries(st.integers(0, 7).map(str), st.integers(0, 64), max_size=3),
                             st.sampled_from(["keep", "empty", "fix", "fix", "fix", "fix"]),
                             st.sampled_from([None] * 9 + ["keep"])).map(lambda c: _wait(body, *c))
        if op == "POST /v1/forget" and isinstance(body, dict):
            return st.tuples(TENANT_CHOICE, st.sampled_from(["scratch"] * 7 + ["keep"])).map(lambda c: _forget(body, *c))
        if op == "POST /v1/admin/keys" and isinstance(body, dict):
            return st.sampled_from(["fix"] * 4 + ["keep"]).map(lambda c: _new_key(body, c))
        if op == "POST /dashboard/session" and isinstance(body, dict):  # signing in with an admin key works, once in four
            return st.sampled_from([admin_key, None, None, None]).map(lambda k: body if k is None else {**body, "token": k})
        return st.just(body)

    def flatmap_query(context, query):
        if query and "conversation_id" in query:  # the sample's conversation, 3 times in 4
            query = dict(query)
            choice = st.sampled_from([CONVERSATION] * 3 + [query["conversation_id"]])
            if "tenant_id" in query:
                return st.tuples(TENANT_CHOICE, choice).map(lambda c: {**with_tenant(query, c[0]), "conversation_id": c[1]})
            return choice.map(lambda c: {**query, "conversation_id": c})
        if query and "tenant_id" in query:
            return TENANT_CHOICE.map(lambda c: with_tenant(query, c))
        return st.just(query)

    def flatmap_path_parameters(context, params):
        params = dict(params or {})
        path = context.operation.path
        if "key_id" in params:
            victim = victims["revoke" if path.endswith("/revoke") else "rotate"]
            return st.sampled_from([victim] * 4 + [params["key_id"]]).map(lambda v: {**params, "key_id": v})
        if "event_id" in params:  # the sample's turns, or what was generated
            return st.sampled_from([*SAMPLE_EVENT_IDS, params["event_id"]]).map(lambda v: {**params, "event_id": v})
        if "name" in params and path.startswith("/v1/admin/projections"):
            return st.sampled_from([*VIEW_NAMES, params["name"]]).map(lambda v: {**params, "name": v})
        if "name" in params and path.startswith("/dashboard/assets"):
            return st.sampled_from([*assets, params["name"]]).map(lambda v: {**params, "name": v})
        return st.just(params)

    for hook in (flatmap_body, flatmap_query, flatmap_path_parameters):
        hooks.register_hook_with_name(hook, hook.__name__)
    return hooks


# What every request carries besides what the document describes: a caller's request id (sane or
# not), a dashboard session cookie (forged, malformed or absent) and unknown query parameters. It
# also gives the operations that take no input more than one distinct request.
_PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
NOISE = st.fixed_dictionaries({
    "request_id": st.one_of(st.none(), st.text(_PRINTABLE, max_size=160).map(str.strip)),
    "session": st.one_of(st.none(), st.text(_PRINTABLE.filter(lambda c: c not in ';,"\\'), max_size=100).map(str.strip),
                         st.builds(lambda e, s, h: f"{e}.{s}.{h}", st.integers(0, 2**40), st.sampled_from(["ops", "0123456789abcdef", ""]),
                                   st.text("0123456789abcdef", max_size=64))),
    "query": st.dictionaries(st.sampled_from(["x", "tenant", "debug", "limit"]), st.text(_PRINTABLE, max_size=20), max_size=2),
})


# -- the run --------------------------------------------------------------------------------------
def error_shape(response) -> dict:
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, response.text[:500]
    error = body["error"]
    assert {"code", "message", "details"} <= set(error), error
    assert isinstance(error["code"], str) and error["code"] and isinstance(error["message"], str) and error["message"]
    assert isinstance(error["details"], list)
    assert "Traceback" not in response.text
    return error


def send(stack: Stack, role: str, case, noise: dict):
    kwargs = case.as_transport_kwargs(base_url="http://testserver")
    headers = {k: v for k, v in (kwargs.get("headers") or {}).items() if k.lower() not in ("authorization", "cookie")}
    if role != "none":
        headers.update(bearer(stack.keys[role]))
    if noise["request_id"] is not None:
        headers["X-Request-Id"] = noise["request_id"]
    if noise["session"] is not None:
        headers["Cookie"] = f"memstream_session={noise['session']}"
    body = {}
    if "json" in kwargs:
        body["content"] = json.dumps(kwargs["json"]).encode()
    elif kwargs.get("data") is not None:
        data = kwargs["data"]
        body["content"] = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    stack.client.cookies.clear()  # a session that a fuzzed sign-in obtained must not carry over to the next request
    try:
        return stack.client.request(kwargs["method"], kwargs["url"], headers=headers,
                                    params={**noise["query"], **(kwargs.get("params") or {})}, **body)
    finally:
        stack.client.cookies.clear()


def check(stack: Stack, role: str, label: str, case, response, figures_role: str | None = None) -> None:
    key = (figures_role or role, label)
    reached = stack.observer.reached(label in OPEN)
    figures = stack.figures
    figures.sent[key] += 1
    figures.reached[key] += reached
    figures.statuses[key][response.status_code] += 1
    where = f"{role} key, {label}: {response.status_code} {response.text[:300]}"
    if label == "POST /v1/wait" and response.status_code == 504:
        assert error_shape(response)["code"] == "timeout", where
    else:
        case.validate_response(response, checks=[not_a_server_error])
    if 400 <= response.status_code < 500:
        error_shape(response)
    if label not in MAY_CALL[role]:
        assert not reached, f"the handler ran for a caller who may not call it: {where}"
        assert response.status_code == (401 if role == "none" else 403), where


@pytest.mark.parametrize("label", OPERATIONS)
def test_fuzz_operation_per_role(stack, label):
    operation = stack.operations[label]
    strategy = operation.as_strategy(generation_mode=GenerationMode.POSITIVE, hooks=fuzz_hooks(stack.victims, stack.keys["admin"]["key"]))

    @hsettings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck),
               print_blob=False)
    @given(case=strategy, noise=NOISE)
    def run(case, noise):
        for role in ROLES:
            stack.observer.reset()
            response = send(stack, role, case, noise)
            check(stack, role, label, case, response)

    t0 = time.perf_counter()
    run()
    stack.figures.seconds[label] = time.perf_counter() - t0
    figures = stack.figures
    for role in ROLES:
        sent, reached = figures.sent[(role, label)], figures.reached[(role, label)]
        assert sent >= EXAMPLES, f"{role}: only {sent} requests to {label}"
        if role != "none" and label in MAY_CALL[role]:
            assert reached / sent >= MIN_REACHED, (
                f"{role}: {reached} of {sent} requests to {label} reached the handler: {dict(figures.statuses[(role, label)])}")


NEGATIVE = sorted(set(OPERATIONS) - {"GET /healthz", "GET /dashboard", "DELETE /dashboard/session", "GET /dashboard/assets/{name}"})


def short_waits() -> HookDispatcher:
    hooks = HookDispatcher(scope=HookScope.TEST)

    def map_body(context, body):
        if context.operation.path == "/v1/wait" and isinstance(body, dict):
            timeout = body.get("timeout_seconds", 10.0)  # an invalid request that pydantic still accepts must not wait 10 s
            if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
                return {**body, "timeout_seconds": min(timeout, 0.02)}
        return body

    hooks.register_hook_with_name(map_body, "map_body")
    return hooks


@pytest.mark.parametrize("label", NEGATIVE)
def test_fuzz_operation_with_invalid_input(stack, label):
    """Negative mode: requests the document says are invalid (wrong types, missing and extra
    fields, values out of range; the four operations that take no input have nothing to get
    wrong), with the admin key, which passes every role check, so each request meets request
    validation or the handler: no 5xx, and the one error shape."""
    operation = stack.operations[label]

    @hsettings(max_examples=NEGATIVE_EXAMPLES, derandomize=True, database=None, deadline=None,
               suppress_health_check=list(HealthCheck), print_blob=False)
    @given(case=operation.as_strategy(generation_mode=GenerationMode.NEGATIVE, hooks=short_waits()), noise=NOISE)
    def run(case, noise):
        stack.observer.reset()
        response = send(stack, "admin", case, noise)
        check(stack, "admin", label, case, response, figures_role="admin, invalid input")

    t0 = time.perf_counter()
    run()
    stack.figures.seconds[f"{label} (invalid input)"] = time.perf_counter() - t0
    assert stack.figures.sent[("admin, invalid input", label)] >= NEGATIVE_EXAMPLES


def test_every_operation_of_the_document_is_fuzzed(stack):
    assert set(stack.operations) == set(OPERATIONS)


def report(request, figures: Figures) -> None:
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if terminal is None or not figures.sent:
        return
    with capture.global_and_fixture_disabled():
        terminal.write_line("")
        terminal.write_sep("-", f"API fuzz (schemathesis {schemathesis.__version__}: {EXAMPLES} valid requests per operation and role, {NEGATIVE_EXAMPLES} invalid ones)")
        for role in (*ROLES, "admin, invalid input"):
            rows = sorted(k for k in figures.sent if k[0] == role)
            if not rows:
                continue
            sent = sum(figures.sent[k] for k in rows)
            allowed = [k for k in rows if k[1] in MAY_CALL.get(role, MAY_CALL["admin"])]
            others = [k for k in rows if k not in allowed]
            a_sent, a_reached = sum(figures.sent[k] for k in allowed), sum(figures.reached[k] for k in allowed)
            line = (f"{role}: {sent} requests to {len(rows)} operations; to the {len(allowed)} it may call: {a_sent}, "
                    f"{a_reached / max(a_sent, 1):.1%} reached the handler")
            if others:
                line += f"; to the other {len(others)}: {sum(figures.sent[k] for k in others)}, {sum(figures.reached[k] for k in others)} did"
            terminal.write_line(line)
            for k in rows:
                hist = ", ".join(f"{s}: {n}" for s, n in sorted(figures.statuses[k].items()))
                terminal.write_line(f"  {k[1]:<42} {figures.sent[k]:>4} sent {figures.reached[k] / figures.sent[k]:>7.1%} reached  [{hist}]")
        total = sum(figures.seconds.values())
        terminal.write_line(f"time: {total:.1f} s for {sum(figures.sent.values())} requests "
                            f"({', '.join(f'{lab} {s:.1f} s' for lab, s in sorted(figures.seconds.items(), key=lambda x: -x[1])[:4])} ...)")
