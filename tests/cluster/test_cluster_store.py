"""The lease and member statements on both backends (the `store` fixture runs each test twice)."""

from __future__ import annotations

from daemon.cluster import store as cs
from daemon.store import Conn, Store


def _join(conn: Conn, instance: str, claimant: str, lease_ms: int = 10_000) -> int:
    return cs.join(conn, instance=instance, claimant=claimant, host="h", pid=1, version="v",
                   offers="{}", lease_ms=lease_ms)  # fmt: skip


async def test_a_free_lease_is_taken_once_and_each_take_raises_the_token(store: Store) -> None:
    taken = await store.write(lambda c: cs.acquire(c, ["x", "y"], "a", 10_000))
    assert taken == {"x": 1, "y": 1}
    assert await store.write(lambda c: cs.acquire(c, ["x"], "b", 10_000)) == {}
    await store.write(lambda c: cs.release(c, "x", 1))
    assert await store.write(lambda c: cs.acquire(c, ["x"], "b", 10_000)) == {"x": 2}
    assert await store.read(lambda c: cs.holder(c, "x")) == "b"


async def test_an_expired_lease_moves_and_fences_the_old_holder(store: Store) -> None:
    assert await store.write(lambda c: cs.acquire(c, ["x"], "a", -1)) == {"x": 1}
    assert await store.read(lambda c: cs.holder(c, "x")) is None
    assert await store.write(lambda c: cs.acquire(c, ["x"], "b", 10_000)) == {"x": 2}
    assert await store.write(lambda c: cs.check(c, "x", 1)) is False
    assert await store.write(lambda c: cs.renew(c, [("x", 1)], 10_000)) == []
    assert await store.write(lambda c: cs.check(c, "x", 2)) is True
    assert await store.write(lambda c: cs.renew(c, [("x", 2)], 10_000)) == ["x"]


async def test_the_same_instance_name_takes_its_earlier_process_lease_at_once(store: Store) -> None:
    assert await store.write(lambda c: cs.acquire(c, ["x"], "a", 10_000)) == {"x": 1}
    assert await store.write(lambda c: cs.acquire(c, ["x"], "a", 10_000)) == {"x": 2}


async def test_members_join_heartbeat_and_leave(store: Store) -> None:
    await store.write(lambda c: _join(c, "a", "a/1"))
    await store.write(lambda c: _join(c, "b", "b/1", lease_ms=-1))
    live = await store.read(lambda c: c.execute(f"SELECT * FROM {cs.LIVE_CLAIMANTS} x").fetchall())
    assert [r[0] for r in live] == ["a/1"]
    assert await store.write(lambda c: cs.heartbeat(c, "a", "a/1", 10_000, "h:1", "{}"))
    assert not await store.write(lambda c: cs.heartbeat(c, "a", "a/0", 10_000, "h:1", "{}"))
    await store.write(lambda c: _join(c, "a", "a/2"))
    rows = await store.read(cs.members)
    assert [(m["instance"], m["claimant"]) for m in rows] == [("a", "a/2"), ("b", "b/1")]
    await store.write(lambda c: cs.acquire(c, ["x"], "a", 10_000))
    await store.write(lambda c: cs.leave(c, "a", "a/2"))
    assert [m["instance"] for m in await store.read(cs.members)] == ["b"]
    assert await store.read(lambda c: cs.holder(c, "x")) is None


async def test_requests_go_to_the_lease_holder_in_order(store: Store) -> None:
    await store.write(lambda c: cs.acquire(c, ["task:t1"], "a", 10_000))
    await store.write(lambda c: cs.post_request(c, "task:t1", "start", "{}", "b"))
    await store.write(lambda c: cs.post_request(c, "task:t1", "stop", '{"x": 1}', "c"))
    assert await store.write(lambda c: cs.take_requests(c, "task:t1", 99)) == []
    taken = await store.write(lambda c: cs.take_requests(c, "task:t1", 1))
    assert [(a, b, f) for _, a, b, f in taken] == [("start", "{}", "b"), ("stop", '{"x": 1}', "c")]
    assert await store.write(lambda c: cs.take_requests(c, "task:t1", 1)) == []
