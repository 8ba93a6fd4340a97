"""The password pool (bounded argon2 work) and the hashing cost's OWASP floor."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from argon2 import PasswordHasher, Type, extract_parameters
from pydantic import ValidationError

from bullpen.errors import Unavailable
from bullpen.security.passwords import HashCost, PasswordPool
from bullpen.settings import Settings


def settings(**fields: int) -> Settings:
    """Settings with these password fields (nothing read from the environment)."""
    return Settings(data_dir=Path("/nonexistent"), **fields)  # type: ignore[arg-type]


def test_the_default_cost_is_owasps_argon2id_floor() -> None:
    defaults = settings()
    assert (defaults.password_hash_memory_kib, defaults.password_hash_time_cost) == (19_456, 2)
    assert defaults.password_hash_parallelism == 1
    params = extract_parameters(HashCost().hasher().hash("a password"))
    assert (params.type, params.memory_cost, params.time_cost) == (Type.ID, 19_456, 2)


@pytest.mark.parametrize(
    ("memory_kib", "time_cost"),
    [(47_104, 1), (19_456, 2), (12_288, 3), (9_216, 4), (7_168, 5), (7_168, 9), (65_536, 3)],
)
def test_a_cost_at_or_above_the_floor_is_taken(memory_kib: int, time_cost: int) -> None:
    chosen = settings(password_hash_memory_kib=memory_kib, password_hash_time_cost=time_cost)
    assert chosen.password_hash_memory_kib == memory_kib


@pytest.mark.parametrize(
    ("memory_kib", "time_cost"),
    [(47_103, 1), (19_455, 2), (46_000, 1), (12_287, 3), (7_167, 5), (1_024, 10)],
)
def test_a_cost_below_the_floor_is_refused(memory_kib: int, time_cost: int) -> None:
    with pytest.raises(ValidationError, match=r"(?i)password_hash_memory_kib"):
        settings(password_hash_memory_kib=memory_kib, password_hash_time_cost=time_cost)


async def test_a_full_pool_refuses_at_once_and_takes_work_again_when_free() -> None:
    with PasswordPool(HashCost(), threads=1, queue=1) as pool:
        stored = pool.hash_now("right password")
        running = [asyncio.create_task(pool.verify(stored, "wrong")) for _ in range(2)]
        await asyncio.sleep(0)  # both hold their places: one on the thread, one waiting
        assert pool.full
        with pytest.raises(Unavailable) as refused:
            await pool.verify(stored, "right password")
        assert refused.value.status == 503 and refused.value.retry_after == 1.0
        with pytest.raises(Unavailable):
            await pool.hash("anything")
        assert await asyncio.gather(*running) == [False, False]
        assert (pool.held, pool.verified) == (0, 2)  # the refused call was never run
        assert await pool.verify(stored, "right password")


async def test_stored_hashes_of_another_cost_need_remaking() -> None:
    with PasswordPool(HashCost(), threads=1, queue=0) as pool:
        assert not pool.needs_rehash(await pool.hash("pw"))
        assert pool.needs_rehash(PasswordHasher(memory_cost=1024, time_cost=1).hash("pw"))
        assert pool.needs_rehash(PasswordHasher(type=Type.I).hash("pw"))
        assert pool.needs_rehash("not a hash at all")
        assert not await pool.verify("not a hash at all", "pw")  # no match, no error
