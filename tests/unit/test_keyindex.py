"""KeyIndex: engine keys placed on the query side's unit order."""

import numpy as np

from schemas.keyindex import KeyIndex


def test_positions_and_scatter_place_keys_and_ignore_unknown_ones():
    index = KeyIndex([40, 10, 30])
    np.testing.assert_array_equal(index.positions([30, 99, 40, 10]), [2, -1, 0, 1])
    np.testing.assert_array_equal(index.scatter([10, 99, 40], [0.5, 9.0, 0.25], fill=-1.0), [0.25, 0.5, -1.0])
    assert len(KeyIndex([]).positions([1, 2])) == 2


def test_read_only_key_arrays_are_resolved_once_and_writable_ones_every_time():
    index = KeyIndex([40, 10, 30])
    column = np.array([30, 40], dtype=np.int64)
    column.flags.writeable = False  # an engine's cached column
    first = index.positions(column)
    assert index.positions(column) is first and not first.flags.writeable
    np.testing.assert_array_equal(first, [2, 0])
    equal_copy = column.copy()
    assert index.positions(equal_copy) is not first
    equal_copy[0] = 10  # writable arrays may change between calls: never kept
    np.testing.assert_array_equal(index.positions(equal_copy), [1, 0])
