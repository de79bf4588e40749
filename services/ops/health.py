"""Projection health over a sliding window, in the spirit of LinkedIn's Burrow.

Burrow judges a consumer by its committed offsets over a window instead of by a lag
threshold: a large but shrinking lag is fine, a small lag that never moves is not. The rules,
evaluated on the samples inside the window (oldest first):

- ERROR    a batch failed inside the window (the runner raised; the records were retried).
- OK       lag was zero in some sample (the view caught up at least once), or the window
           holds fewer than `min_samples` samples (not enough evidence yet).
- STALLED  the position did not move across the whole window while lag > 0 (paused views
           included: `paused` is reported separately).
- LAGGING  the position moved but lag grew from the first to the last sample and never
           shrank between two samples.
- OK       otherwise (lag > 0 but it is being worked off).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

STATUSES = ("OK", "LAGGING", "STALLED", "ERROR")


@dataclass(frozen=True)
class Sample:
    at: float  # seconds (monotonic or epoch: only differences matter)
    position: int  # sum of the view's positions over partitions
    lag: int  # events behind the log's end
    errors: int  # cumulative failed batches


class HealthWindow:
    def __init__(self, window_seconds: float = 30.0, min_samples: int = 3):
        self.window_seconds = window_seconds
        self.min_samples = min_samples
        self._samples: deque[Sample] = deque()

    def add(self, sample: Sample) -> None:
        self._samples.append(sample)
        while len(self._samples) > 1 and sample.at - self._samples[0].at > self.window_seconds:
            self._samples.popleft()

    @property
    def samples(self) -> list[Sample]:
        return list(self._samples)

    def rate(self) -> float:
        """Records per second over the window, from position deltas (works whoever processes)."""
        s = self._samples
        if len(s) < 2 or s[-1].at <= s[0].at:
            return 0.0
        return max(0, s[-1].position - s[0].position) / (s[-1].at - s[0].at)

    def status(self) -> str:
        s = list(self._samples)
        if not s:
            return "OK"
        if s[-1].errors > s[0].errors:
            return "ERROR"
        if any(x.lag == 0 for x in s) or len(s) < self.min_samples:
            return "OK"
        if s[-1].position == s[0].position:
            return "STALLED"
        growing = all(b.lag >= a.lag for a, b in zip(s, s[1:])) and s[-1].lag > s[0].lag
        return "LAGGING" if growing else "OK"
