"""Contract of the ViewCatalog port: which generation of each view is live; replay builds a new
one beside it and `activate` switches readers atomically. Run against every adapter."""

from __future__ import annotations

import uuid

import pytest

pytestmark = pytest.mark.contract


def _sqlite(tmp_path):
    from infra.catalog.sqlite import SqliteViewCatalog

    return SqliteViewCatalog(tmp_path / "catalog.sqlite")


ADAPTERS = {"sqlite": _sqlite}


@pytest.fixture(params=sorted(ADAPTERS))
def catalog(request, tmp_path):
    return ADAPTERS[request.param](tmp_path)


@pytest.fixture
def view():
    # A fresh view name per test, so adapters that share a server never see each other's state.
    return f"lexical{uuid.uuid4().hex[:6]}"


def test_generations_are_reserved_then_activated(catalog, view):
    assert catalog.current(view) is None
    g1 = catalog.new_generation(view)
    assert catalog.current(view) is None and catalog.building(view) == [g1]
    catalog.activate(view, g1)
    assert catalog.current(view) == g1 and catalog.building(view) == [] and catalog.retired(view) == []


def test_activation_switches_and_retires_the_previous_generation(catalog, view):
    g1 = catalog.new_generation(view)
    catalog.activate(view, g1)
    g2 = catalog.new_generation(view)
    assert g2 > g1 and catalog.current(view) == g1  # building does not disturb readers
    catalog.activate(view, g2)
    assert catalog.current(view) == g2 and catalog.retired(view) == [g1]
    catalog.drop(view, g1)
    assert catalog.retired(view) == []
    assert catalog.new_generation(view) > g2  # numbers are never reused


def test_views_are_independent(catalog, view):
    other = view + "x"
    catalog.activate(view, catalog.new_generation(view))
    assert catalog.current(other) is None
