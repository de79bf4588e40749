"""The distribution's version, in one place for `__version__` and the User-Agent (a test holds
pyproject.toml's `version` to it)."""

__version__ = "0.2.0"
