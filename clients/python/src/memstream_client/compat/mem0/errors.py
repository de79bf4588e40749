"""What the Mem0 surface raises besides memstream's own errors; both are MemstreamErrors and the
built-in exception Mem0's callers catch."""

from __future__ import annotations

from memstream_client.errors import MemstreamError


class ValidationError(MemstreamError, ValueError):
    """Mem0's `mem0.exceptions.ValidationError` (a ValueError, as mem0ai raises for bad input): an
    argument or a filter Mem0 would refuse."""


class NotSupported(MemstreamError, NotImplementedError):
    """A Mem0 feature memstream does not have (per-memory expiry, memory types, categories, apps…);
    ignoring it would change what is kept or returned, so it is refused by name."""
