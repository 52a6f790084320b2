"""Cost: the one number the search compares.

Following the Collage RFC, a cost is a latency in seconds. It is additive and totally ordered,
with two special values: *invalid* (+inf: the toolchain cannot build or run the candidate) and
*unknown* (NaN: nobody knows yet; some other estimate must answer). Keeping the special values
inside the type means a failed measurement flows through the search as data instead of as an
exception.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, order=False)
class Cost:
    """A latency in seconds; +inf is invalid, NaN is unknown."""

    seconds: float

    @staticmethod
    def invalid() -> Cost:
        return Cost(math.inf)

    @staticmethod
    def unknown() -> Cost:
        return Cost(math.nan)

    @staticmethod
    def zero() -> Cost:
        return Cost(0.0)

    @property
    def is_invalid(self) -> bool:
        return math.isinf(self.seconds) and self.seconds > 0

    @property
    def is_unknown(self) -> bool:
        return math.isnan(self.seconds)

    @property
    def is_known(self) -> bool:
        """A finite, usable cost."""
        return math.isfinite(self.seconds)

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.seconds + other.seconds)

    def __lt__(self, other: Cost) -> bool:
        return self.seconds < other.seconds

    def __le__(self, other: Cost) -> bool:
        return self.seconds <= other.seconds

    def __str__(self) -> str:
        if self.is_invalid:
            return "invalid"
        if self.is_unknown:
            return "unknown"
        s = self.seconds
        if s >= 1.0:
            return f"{s:.3f}s"
        if s >= 1e-3:
            return f"{s * 1e3:.3f}ms"
        return f"{s * 1e6:.1f}us"
