"""The k6-style schedule: targets at boundaries, scaling and validation."""

import math

import pytest

from bullpen.bench.stages import (
    Stage,
    default_stages,
    stage_at,
    stage_start,
    target_at,
    total_duration,
)


def test_default_schedule_is_the_reference_scenario() -> None:
    stages = default_stages()
    assert [(s.name, s.duration_s, s.target) for s in stages] == [
        ("ramp-50", 30.0, 50),
        ("hold-50", 60.0, 50),
        ("ramp-80", 20.0, 80),
        ("hold-80", 60.0, 80),
        ("ramp-down", 10.0, 0),
    ]
    assert total_duration(stages) == 180.0


def test_scale_multiplies_durations_only() -> None:
    stages = default_stages(scale=0.1, peak=8, hold=5)
    assert [s.name for s in stages] == ["ramp-5", "hold-5", "ramp-8", "hold-8", "ramp-down"]
    assert [s.target for s in stages] == [5, 5, 8, 8, 0]
    assert math.isclose(total_duration(stages), 18.0)
    assert math.isclose(stage_start(stages, 2), 9.0)


@pytest.mark.parametrize("scale", [0.0, -1.0, math.nan, math.inf])
def test_scale_must_be_positive_and_finite(scale: float) -> None:
    with pytest.raises(ValueError):
        default_stages(scale=scale)


@pytest.mark.parametrize(
    ("duration", "target"), [(-1.0, 5), (math.nan, 5), (math.inf, 5), (1.0, -1)]
)
def test_stage_validates(duration: float, target: int) -> None:
    with pytest.raises(ValueError):
        Stage(duration, target, "bad")


@pytest.mark.parametrize(
    ("t", "expected"),
    [
        (-5.0, 0),  # before the start
        (0.0, 0),
        (0.5, 0),  # 0.83 VUs asked: not yet one
        (0.6, 1),
        (15.0, 25),
        (29.99, 49),
        (30.0, 50),  # a ramp reaches its target exactly at its end
        (89.99, 50),
        (90.0, 50),
        (100.0, 65),
        (110.0, 80),
        (170.0, 80),
        (175.0, 40),
        (179.99, 1),  # ramping down, the last VU leaves only at the end
        (180.0, 0),
        (1_000.0, 0),  # after the end: the last target
    ],
)
def test_target_at(t: float, expected: int) -> None:
    assert target_at(default_stages(), t) == expected


def test_zero_duration_stage_jumps() -> None:
    stages = [Stage(0.0, 10, "jump"), Stage(5.0, 10, "hold"), Stage(0.0, 0, "stop")]
    assert target_at(stages, 0.0) == 10
    assert target_at(stages, 4.99) == 10
    assert target_at(stages, 5.0) == 0
    assert stage_at(stages, 0.0) == 1


def test_ramp_from_nonzero_start_never_overshoots() -> None:
    stages = [Stage(1.0, 10, "a"), Stage(10.0, 20, "b"), Stage(10.0, 5, "c")]
    values = [target_at(stages, i / 10) for i in range(0, 220)]
    assert max(values) == 20
    assert all(0 <= v <= 20 for v in values)
    # monotone within each ramp
    assert values[10:110] == sorted(values[10:110])
    assert values[110:210] == sorted(values[110:210], reverse=True)


@pytest.mark.parametrize(
    ("t", "expected"),
    [(-1.0, 0), (0.0, 0), (29.999, 0), (30.0, 1), (89.999, 1), (90.0, 2), (179.9, 4), (180.0, 4)],
)
def test_stage_at_boundaries(t: float, expected: int) -> None:
    assert stage_at(default_stages(), t) == expected


def test_stage_at_needs_stages_and_target_at_of_nothing_is_zero() -> None:
    with pytest.raises(ValueError):
        stage_at([], 1.0)
    assert target_at([], 1.0) == 0
