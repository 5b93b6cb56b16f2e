from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import trio

from daemon.outbox import MemoryStream, NewItem, Outbox, advance_cursor
from daemon.store import one, open_store


def items(*keys: str, expires_ms: int | None = None) -> list[NewItem]:
    return [NewItem(key=k, body=k.encode(), meta={"k": k}, expires_ms=expires_ms) for k in keys]


async def test_append_read_ack_in_order(outbox: Outbox) -> None:
    assert await outbox.append("s", items("a", "b", "c")) == [1, 2, 3]
    batch = await outbox.next_batch("s", 2)
    assert [(i.seq, i.key, i.body, i.meta) for i in batch] == [
        (1, "a", b"a", {"k": "a"}),
        (2, "b", b"b", {"k": "b"}),
    ]
    await outbox.ack("s", 2)
    assert [i.key for i in await outbox.next_batch("s", 10)] == ["c"]
    state = await outbox.state("s")
    assert (state.last_seq, state.ack_cursor, state.pending) == (3, 2, 1)


async def test_cursor_never_moves_back_and_numbering_continues(outbox: Outbox) -> None:
    await outbox.append("s", items("a", "b"))
    await outbox.ack("s", 2)
    await outbox.ack("s", 1)
    assert await outbox.append("s", items("c")) == [3]
    assert [i.seq for i in await outbox.next_batch("s", 10)] == [3]


async def test_advance_cursor_skips_items_that_a_later_ack_deletes(outbox: Outbox) -> None:
    await outbox.append("s", items("a", "b", "c"))
    await outbox.store.write(lambda c: advance_cursor(c, "s", 2))
    await outbox.store.write(lambda c: advance_cursor(c, "s", 1))  # never backwards
    assert [i.key for i in await outbox.next_batch("s", 10)] == ["c"]
    state = await outbox.state("s")
    assert (state.ack_cursor, state.pending) == (2, 1)
    rows = "SELECT count(*) FROM outbox_items WHERE stream = 's'"
    assert await outbox.store.read(lambda c: one(c, rows)[0]) == 3  # kept until an ack
    await outbox.ack("s", 3)
    assert await outbox.store.read(lambda c: one(c, rows)[0]) == 0


async def test_streams_are_independent(outbox: Outbox) -> None:
    await outbox.append("x", items("a"))
    await outbox.append("y", items("b", "c"))
    await outbox.ack("y", 1)
    assert [i.key for i in await outbox.next_batch("x", 10)] == ["a"]
    assert [i.key for i in await outbox.next_batch("y", 10)] == ["c"]


async def test_append_joins_callers_transaction(outbox: Outbox) -> None:
    await outbox.store.write(lambda c: c.execute("CREATE TABLE progress(v INTEGER)"))

    def also_fails(conn: object) -> None:
        raise RuntimeError("state change failed")

    with pytest.raises(RuntimeError):
        await outbox.append("s", items("a"), also=also_fails)
    assert (await outbox.state("s")).last_seq == 0  # the append rolled back with it


async def test_next_batch_waits_for_append(outbox: Outbox, autojump_clock: object) -> None:
    got: list[str] = []

    async def drainer() -> None:
        got.extend(i.key for i in await outbox.next_batch("s", 10))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(drainer)
        await trio.sleep(1)
        assert got == []
        await outbox.append("s", items("a"))
    assert got == ["a"]


async def test_take_skips_expired_items(outbox: Outbox) -> None:
    now = outbox.clock_ms()
    await outbox.append("q", items("old", expires_ms=now - 1))
    await outbox.append("q", items("live1", "live2", expires_ms=now + 60_000))
    taken, expired = await outbox.take("q", 10)
    assert [i.key for i in taken] == ["live1", "live2"]
    assert expired == 1
    assert (await outbox.state("q")).pending == 0


async def test_wait_pending_below_is_released_by_ack(
    outbox: Outbox, autojump_clock: object
) -> None:
    await outbox.append("s", items("a", "b", "c"))
    released = trio.Event()

    async def producer() -> None:
        await outbox.wait_pending_below("s", 2)
        released.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        await trio.sleep(1)
        assert not released.is_set()
        await outbox.ack("s", 2)
    assert released.is_set()


CRASHER = textwrap.dedent(
    """
    import os, sys, trio
    from daemon.outbox import NewItem, Outbox
    from daemon.store import open_store

    async def main(path):
        async with open_store(path) as store:
            outbox = Outbox(store)
            for i in range(50):
                await outbox.append("s", [NewItem(key=f"k{i}", body=b"x")])
            await outbox.ack("s", 20)
            print("ready", flush=True)
            os.kill(os.getpid(), 9)

    trio.run(main, sys.argv[1])
    """
)


async def test_outbox_survives_kill_9(tmp_path: Path) -> None:
    db = tmp_path / "crawld.db"
    proc = await trio.run_process(
        [sys.executable, "-c", CRASHER, str(db)],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert proc.returncode == -9, proc.stderr
    assert b"ready" in proc.stdout
    async with open_store(db) as store:
        outbox = Outbox(store)
        state = await outbox.state("s")
        assert (state.last_seq, state.ack_cursor, state.pending) == (50, 20, 30)
        batch = await outbox.next_batch("s", 100)
        assert [i.key for i in batch] == [f"k{i}" for i in range(20, 50)]


async def test_memory_stream_backpressure(autojump_clock: object) -> None:
    stream = MemoryStream("m", capacity=2)
    appended: list[int] = []

    async def producer() -> None:
        for key in "abcd":
            appended.extend(await stream.append(items(key)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        await trio.sleep(1)
        assert appended == [1, 2]  # full: the producer waits
        batch = await stream.next_batch(10)
        await stream.ack(batch[-1].seq)
        await trio.sleep(1)
        assert appended == [1, 2, 3, 4]
    assert [i.key for i in await stream.next_batch(10)] == ["c", "d"]


async def test_open_store_twice_reuses_data(tmp_path: Path) -> None:
    async with open_store(tmp_path / "db") as store:
        await Outbox(store).append("s", items("a"))
    async with open_store(tmp_path / "db") as store:
        assert (await Outbox(store).state("s")).pending == 1
