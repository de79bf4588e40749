"""Ports: the interfaces adapters in `infra/` implement. One module per store kind; the
docstrings state the behaviour that matters, and tests/contracts holds one suite per port that
every adapter must pass."""
