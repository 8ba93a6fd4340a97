"""k6-style load stages: the virtual-user count ramps linearly from one target to the next.

The schedule starts at 0 VUs. During stage *i* the count moves in a straight line from the
previous stage's target to stage *i*'s target, and it only steps once the line has crossed a
whole number (a ramp from 0 to 50 over 30 s reaches 50 exactly at 30 s, and a ramp down
reaches 0 exactly at its end), which is how k6's `ramping-vus` executor behaves. A stage of
zero duration jumps straight to its target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Stage", "default_stages", "stage_at", "stage_start", "target_at", "total_duration"]


@dataclass(frozen=True)
class Stage:
    """One leg of the schedule: reach `target` VUs over `duration_s` seconds."""

    duration_s: float
    target: int
    name: str

    def __post_init__(self) -> None:
        if not math.isfinite(self.duration_s) or self.duration_s < 0:
            raise ValueError(f"stage duration must be finite and >= 0, got {self.duration_s}")
        if self.target < 0:
            raise ValueError(f"stage target must be >= 0, got {self.target}")


def default_stages(scale: float = 1.0, peak: int = 80, hold: int = 50) -> list[Stage]:
    """Return the reference scenario: ramp to `hold`, hold, ramp to `peak`, hold, ramp down."""
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    if hold < 0 or peak < 0:
        raise ValueError(f"VU targets must be >= 0, got hold={hold} peak={peak}")
    return [
        Stage(30.0 * scale, hold, f"ramp-{hold}"),
        Stage(60.0 * scale, hold, f"hold-{hold}"),
        Stage(20.0 * scale, peak, f"ramp-{peak}"),
        Stage(60.0 * scale, peak, f"hold-{peak}"),
        Stage(10.0 * scale, 0, "ramp-down"),
    ]


def total_duration(stages: Sequence[Stage]) -> float:
    """Return the schedule's length in seconds."""
    return math.fsum(s.duration_s for s in stages)


def stage_start(stages: Sequence[Stage], index: int) -> float:
    """Return the offset in seconds at which stage `index` begins."""
    return math.fsum(s.duration_s for s in stages[:index])


def stage_at(stages: Sequence[Stage], t: float) -> int:
    """Return the index of the stage running at `t` seconds (start inclusive, end exclusive).

    Before the start this is 0; at or after the end it is the last stage.
    """
    if not stages:
        raise ValueError("no stages")
    start = 0.0
    for i, stage in enumerate(stages):
        end = start + stage.duration_s
        if t < end:
            return i
        start = end
    return len(stages) - 1


def target_at(stages: Sequence[Stage], t: float) -> int:
    """Return the VU count the schedule asks for at `t` seconds."""
    previous = 0
    start = 0.0
    for stage in stages:
        end = start + stage.duration_s
        if t < end:
            if t <= start:
                return previous
            line = previous + (stage.target - previous) * (t - start) / stage.duration_s
            # Step only once the line has crossed the next whole number, towards the target.
            return math.floor(line) if stage.target >= previous else math.ceil(line)
        previous = stage.target
        start = end
    return previous
