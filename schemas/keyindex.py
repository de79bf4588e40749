"""Vectorised lookup of unit keys (schemas.units.unit_key) to positions.

Engines answer a boundary-wide query with (keys, scores) arrays in their own order; the query
side places them on its own unit order. With a dict lookup per key that cost ~0.3 ms per call
for a LoCoMo conversation, with a sorted search over arrays ~20 us.
"""

from __future__ import annotations

import numpy as np


class KeyIndex:
    """unit_key -> position over a fixed list of keys."""

    def __init__(self, keys: list[int]):
        k = np.array(keys, dtype=np.int64).reshape(-1)
        self._order = np.argsort(k, kind="stable")
        self._sorted = k[self._order]

    def __len__(self) -> int:
        return len(self._sorted)

    def positions(self, keys) -> np.ndarray:
        """Position of each key, -1 for keys outside the index."""
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        if not len(self._sorted) or not len(keys):
            return np.full(len(keys), -1, dtype=np.int64)
        i = np.minimum(np.searchsorted(self._sorted, keys), len(self._sorted) - 1)
        return np.where(self._sorted[i] == keys, self._order[i], -1)

    def scatter(self, keys, values, fill: float = 0.0) -> np.ndarray:
        """An array over the indexed positions holding `values` at their keys' positions."""
        out = np.full(len(self._sorted), fill, dtype=float)
        p = self.positions(keys)
        hit = p >= 0
        out[p[hit]] = np.asarray(values, dtype=float).reshape(-1)[hit]
        return out
