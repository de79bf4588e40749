"""The HTTP API's OpenAPI document is a contract: the checked-in `docs/openapi.json` (from which
the TypeScript client's types are generated) must be exactly what the server serves."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from services import openapi_doc

pytestmark = pytest.mark.unit
REPO = openapi_doc.DOC.parents[1]


def test_the_served_document_is_the_checked_in_one(tmp_path):
    from infra.settings import Settings
    from services.api import create_app

    served = TestClient(create_app(Settings.load(data_dir=tmp_path))).get("/openapi.json")  # no lifespan: nothing starts
    assert served.status_code == 200
    assert openapi_doc.render(served.json()) == openapi_doc.DOC.read_text(encoding="utf-8"), (
        "docs/openapi.json is stale: run `memstream schemas export` and commit it (clients/typescript regenerates its types from it)")


def test_every_listing_takes_a_cursor():
    doc = json.loads(openapi_doc.DOC.read_text(encoding="utf-8"))
    listings = {"/v1/turns": "next_cursor", "/v1/admin/keys": "next_cursor", "/v1/dead-letters": "next_cursor", "/v1/admin/audit": "next_cursor"}
    for path in listings:
        params = {p["name"] for p in doc["paths"][path]["get"].get("parameters", [])}
        assert {"cursor", "limit"} <= params or path == "/v1/admin/audit" and "cursor" in params, f"{path} is not paginated: {params}"


def test_the_served_version_is_the_distributions():
    import tomllib

    from services import __version__

    with open(REPO / "pyproject.toml", "rb") as f:
        assert tomllib.load(f)["project"]["version"] == __version__
