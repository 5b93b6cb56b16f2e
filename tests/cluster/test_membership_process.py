"""Cluster membership of real `crawld run` processes on one PostgreSQL schema: three join and see
each other, a second process of one name is refused, a killed instance's leases move within the
lease, a paused one loses its leases and comes back, and a config differing on the lease is
named (in /status and by `crawld check-config --secrets`)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import trio

from tests.cluster.harness import Instances, wait_for

pytestmark = [pytest.mark.process, pytest.mark.postgres]

LEASE_S = 2.0


async def alive_names(instances: Instances, key: str) -> set[str]:
    return {m["instance"] for m in (await instances.cluster(key))["members"] if m["alive"]}


async def test_three_instances_join_and_see_each_other(instances: Instances) -> None:
    names = ["a", "b", "c"]
    for name in names:
        await instances.start(name)

    async def all_see_three() -> bool:
        for key in names:
            section = await instances.cluster(key)
            members = section["by_name"]
            if set(members) != set(names) or not all(m["http"] for m in members.values()):
                return False
        return True

    await wait_for(all_see_three, 10)
    for key in names:
        section = await instances.cluster(key)
        assert section["enabled"] is True and section["instance"] == key
        assert section["disagreements"] == []
        for name, member in section["by_name"].items():
            inst = instances[name]
            assert member["alive"] is True
            assert member["pid"] == inst.pid and member["host"]
            assert member["http"] == f"127.0.0.1:{inst.port}"
            assert member["self"] is (name == key)
            assert isinstance(member["holds"], list)
        metrics = await instances.metrics(key)
        samples = [line for line in metrics.splitlines() if line.startswith("crawld_")]
        assert samples
        assert all(f'instance="{key}"' in line for line in samples), [
            line for line in samples if f'instance="{key}"' not in line
        ][:5]
        assert re.search(
            rf'crawld_cluster_members\{{.*instance="{key}".*state="alive".*\}} 3', metrics
        )


DUTIES = 6
ALL_DUTIES = {f"test:duty-{i}" for i in range(DUTIES)}
WITH_DUTIES = ("-m", "tests.cluster.lease_daemon", str(DUTIES), "--config", "{config}")


async def holders(instances: Instances, key: str) -> dict[str, str]:
    """Test lease → the alive instance holding it, as `key` sees it (asserting none is held
    twice); the areas' own leases (jobs:expiry…) are left out."""
    found: dict[str, str] = {}
    for member in (await instances.cluster(key))["members"]:
        for lease in member["holds"] if member["alive"] else []:
            if lease not in ALL_DUTIES:
                continue
            assert lease not in found, (lease, found[lease], member["instance"])
            found[lease] = member["instance"]
    return found


async def test_a_second_process_of_one_name_exits_1_naming_the_first(
    instances: Instances,
) -> None:
    await instances.start("a")
    instances.add("a-again", instance="a")
    code, stderr = await instances.run("a-again")
    assert code == 1, stderr
    assert "instance name 'a' is in use" in stderr and "server pid" in stderr, stderr
    assert instances["a"].running()
    members = (await instances.cluster("a"))["by_name"]
    assert list(members) == ["a"] and members["a"]["pid"] == instances["a"].pid


async def test_kill_9_moves_every_lease_within_the_lease(instances: Instances) -> None:
    for key in ("a", "b", "c"):
        instances.add(key, command=WITH_DUTIES)
    await instances.start("a")
    assert await wait_for(lambda: holders_are(instances, "a", dict.fromkeys(ALL_DUTIES, "a")), 10)
    await instances.start("b")
    await instances.start("c")
    await wait_for(lambda: alive_names_are(instances, "b", {"a", "b", "c"}), 10)

    instances.kill9("a")
    killed_at = trio.current_time()

    async def moved() -> dict[str, str] | None:
        section = await instances.cluster("b")
        if section["by_name"]["a"]["alive"]:
            return None
        held = await holders(instances, "b")
        return held if set(held) == ALL_DUTIES else None

    held = await wait_for(moved, LEASE_S + 5, every=0.05)
    took = trio.current_time() - killed_at
    assert took <= LEASE_S + 2, took
    assert set(held.values()) <= {"b", "c"}
    assert await holders(instances, "c") == held  # both survivors see the same
    taken = [(await instances.cluster(k))["counters"]["taken"] for k in ("b", "c")]
    assert sum(taken) >= DUTIES  # every duty taken by one survivor (and the areas' leases)


async def test_a_paused_instance_loses_its_leases_and_comes_back(instances: Instances) -> None:
    for key in ("a", "b"):
        instances.add(key, command=WITH_DUTIES)
    await instances.start("a")
    assert await wait_for(lambda: holders_are(instances, "a", dict.fromkeys(ALL_DUTIES, "a")), 10)
    await instances.start("b")
    await wait_for(lambda: alive_names_are(instances, "b", {"a", "b"}), 10)

    instances.pause("a")
    paused_at = trio.current_time()
    await wait_for(
        lambda: holders_are(instances, "b", dict.fromkeys(ALL_DUTIES, "b")), LEASE_S + 5, 0.05
    )
    assert trio.current_time() - paused_at <= LEASE_S + 2
    assert (await instances.cluster("b"))["by_name"]["a"]["alive"] is False
    await trio.sleep(LEASE_S)  # well past the lease: a's own clock ran out too
    instances.resume("a")

    await wait_for(lambda: alive_names_are(instances, "b", {"a", "b"}), LEASE_S + 3)
    section = await wait_for(lambda: lost_all(instances, "a"), LEASE_S + 3)
    assert section["counters"]["lost"] >= DUTIES
    assert not ALL_DUTIES & set(section["leases_held"])
    assert await holders(instances, "a") == dict.fromkeys(ALL_DUTIES, "b")
    counters = (await instances.cluster("b"))["counters"]
    assert counters["taken"] >= DUTIES and counters["lost"] == 0 and counters["released"] == 0


async def holders_are(instances: Instances, key: str, expected: dict[str, str]) -> bool:
    return await holders(instances, key) == expected


async def alive_names_are(instances: Instances, key: str, expected: set[str]) -> bool:
    return await alive_names(instances, key) == expected


async def lost_all(instances: Instances, key: str) -> dict[str, Any] | None:
    section = await instances.cluster(key)
    return section if section["counters"]["lost"] >= DUTIES else None


async def test_a_different_lease_is_named_in_status_and_by_check_config(
    instances: Instances,
) -> None:
    await instances.start("a")
    instances.add("b", lease="3s")
    await instances.start("b")
    section = await wait_for(lambda: disagreeing(instances, "a"), 10)
    assert section["disagreements"] == ["$.cluster.lease: 2s here, 3s on b"]
    b_section = await wait_for(lambda: disagreeing(instances, "b"), 10)
    assert b_section["disagreements"] == ["$.cluster.lease: 3s here, 2s on a"]

    assert await instances.stop("b") == 0  # a clean stop leaves the member table
    other_queue = instances.add("c", '[broker]\nqueue = "elsewhere"\n')
    ok = await instances.crawld("check-config", "--secrets", str(other_queue.config))
    out, err = ok.stdout.decode(), ok.stderr.decode()
    assert ok.returncode == 0, (out, err)
    assert "cluster: 1 member in the store" in out
    assert re.search(r"  a: alive, last heartbeat \d+\.\ds ago \(host .+, pid \d+, http ", out)
    assert "warning: cluster: $.broker: configured differently on a" in err
    assert "error" not in err, err

    longer = instances.add("c", lease="3s")
    refused = await instances.crawld("check-config", "--secrets", str(longer.config))
    err = refused.stderr.decode()
    assert refused.returncode == 2, err
    assert "error: cluster: $.cluster.lease: 3s here, 2s on a" in err

    same_name = instances.add("c", instance="a")
    named = await instances.crawld("check-config", "--secrets", str(same_name.config))
    assert named.returncode == 0
    assert "$.cluster.instance: 'a' is the name of a live member" in named.stderr.decode()


async def disagreeing(instances: Instances, key: str) -> dict[str, Any] | None:
    section = await instances.cluster(key)
    return section if section["disagreements"] else None
