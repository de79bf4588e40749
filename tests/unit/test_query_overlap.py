"""QueryContext.ahead: a query's independent reads overlap on server stores, run in place on
embedded ones, and either way hand back the result or the error where it is collected."""

from __future__ import annotations

import threading

import pytest

from schemas.errors import StoreError, ViewUnavailable
from schemas.ports.views import Boundary, once_per_request, read_scope
from schemas.query import SearchRequest
from services.query.context import QueryContext

pytestmark = pytest.mark.unit


class _Store:
    backend = "fake"

    def __init__(self, remote: bool):
        self.remote = remote
        self.reads = 0

    @once_per_request
    def version(self, key: str) -> int:
        self.reads += 1
        return self.reads

    def fail(self):
        raise StoreError("the server went away")


class _Views:
    def __init__(self, **stores):
        self.stores = stores

    def store(self, view):
        return self.stores[view]


def _ctx(**stores) -> QueryContext:
    return QueryContext(SearchRequest(question="q", tenant_id="t1"), Boundary("t1"), corpus=None, views=_Views(**stores), encoder=None)


def test_on_a_server_the_read_runs_beside_the_caller_inside_the_callers_read_scope():
    ctx = _ctx(dense=_Store(remote=True))
    caller = threading.get_ident()
    with read_scope():
        first = ctx.store("dense").version("c1")
        got = ctx.ahead(lambda: (threading.get_ident(), ctx.store("dense").version("c1")), "dense").result()
    assert got[0] != caller  # another thread
    assert got[1] == first  # the request's pinned version: the scope came along


def test_on_embedded_stores_the_read_runs_here_now_or_when_asked_for():
    ctx = _ctx(lexical=_Store(remote=False))
    ran: list[int] = []
    now = ctx.ahead(lambda: ran.append(threading.get_ident()) or "now", "lexical")
    assert ran == [threading.get_ident()] and now.done()
    later = ctx.ahead(lambda: ran.append(threading.get_ident()) or "later", "lexical", deferred=True)
    assert len(ran) == 1 and not later.done()
    assert later.result() == "later" and ran == [threading.get_ident()] * 2


@pytest.mark.parametrize("remote", [True, False], ids=["server", "embedded"])
def test_an_error_surfaces_where_the_result_is_collected(remote):
    ctx = _ctx(graph=_Store(remote=remote))
    pending = ctx.ahead(lambda: ctx.store("graph").fail(), "graph")  # no raise here
    with pytest.raises(ViewUnavailable) as err:
        pending.result()
    assert err.value.view == "graph"


def test_overlap_off_keeps_every_read_on_the_callers_thread():
    ctx = _ctx(dense=_Store(remote=True))
    ctx.overlap = False
    assert ctx.ahead(threading.get_ident, "dense").result() == threading.get_ident()
