"""Time-ordered row ids: UUIDv7 as RFC 9562 lays it out, sorting by creation time."""

from __future__ import annotations

import time

from bullpen.store.ids import time_ordered_id


def test_an_id_is_a_version_7_uuid_with_the_time_in_its_first_48_bits() -> None:
    before = time.time_ns() // 1_000_000
    new = time_ordered_id()
    after = time.time_ns() // 1_000_000
    assert new.version == 7
    assert new.variant == "specified in RFC 4122"
    assert before <= new.int >> 80 <= after


def test_ids_made_later_sort_later_and_never_repeat() -> None:
    earlier = [time_ordered_id() for _ in range(1000)]
    time.sleep(0.002)
    later = [time_ordered_id() for _ in range(1000)]
    assert max(earlier) < min(later)
    assert len(set(earlier + later)) == 2000
