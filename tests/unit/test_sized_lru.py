"""schemas/sized_lru.py: bounded by what the values hold in all, least recently used out first."""

from schemas.sized_lru import SizedLRU


def test_values_are_made_once_and_the_least_recently_used_go_past_the_bound():
    made: list[str] = []
    lru: SizedLRU[list[int]] = SizedLRU(limit=10)

    def make(key: str, n: int):
        return lambda: made.append(key) or list(range(n))

    lru.get("a", make("a", 4))
    lru.get("b", make("b", 4))
    assert lru.get("a", make("a", 4)) == [0, 1, 2, 3] and made == ["a", "b"]  # a hit makes nothing
    lru.get("c", make("c", 4))  # 12 > 10: b, the least recently used, goes
    assert [k for k, _ in lru.loaded()] == ["a", "c"]
    lru.get("b", make("b", 4))  # made again on its next use
    assert made == ["a", "b", "c", "b"]


def test_the_value_just_used_stays_however_large():
    lru: SizedLRU[list[int]] = SizedLRU(limit=3)
    lru.get("small", lambda: [1])
    big = lru.get("big", lambda: list(range(100)))
    assert [k for k, _ in lru.loaded()] == ["big"] and len(big) == 100
    lru.clear()
    assert lru.loaded() == []
