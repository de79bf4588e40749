"""The read path and the gateways: the HTTP API (ingest, search, status), the CLI, the
query service and the evaluation harness. Entry points compose adapters from infra/ with the
logic in streams/ and services/query/."""

__version__ = "0.2.0"  # the distribution's (pyproject.toml; a test holds them equal), served in the API and MCP
