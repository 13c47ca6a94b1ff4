"""A fake clock to share between the test server and a client: ``sleep`` advances ``time``."""

from __future__ import annotations


class FakeClock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)
