"""Fixtures shared by the end-to-end tests of the clients and the examples of docs/agents.md."""

from __future__ import annotations

import time

import pytest

from memstream_client import AuthenticationError, Client
from tests.integration import servers

TENANT, OTHER = "acme", "globex"


@pytest.fixture(scope="session")
def served(tmp_path_factory):
    """One `memstream serve` (embedded, real models) for the session, with a writer and a reader of `acme`, a writer of
    `globex` and an admin key."""
    work = tmp_path_factory.mktemp("clients")
    with servers.memstream_serve(work) as s:
        env = servers.embedded_env(s.data_dir)
        s.keys = {"writer": servers.cli_key(s.data_dir, "writer", TENANT, env=env)["key"],
                  "reader": servers.cli_key(s.data_dir, "reader", TENANT, env=env)["key"],
                  "other": servers.cli_key(s.data_dir, "writer", OTHER, env=env)["key"],
                  "admin": s.admin_key["key"]}
        deadline = time.monotonic() + 30  # keys reach the server within its refresh bound
        while not _works(s.url, s.keys["writer"]):
            assert time.monotonic() < deadline, "the new keys were never accepted"
            time.sleep(0.2)
        yield s


def _works(url: str, key: str) -> bool:
    try:
        with Client(url, key) as c:
            c.status()
        return True
    except AuthenticationError:
        return False


