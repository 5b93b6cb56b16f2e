"""Cluster membership of real `crawld run` processes on one PostgreSQL schema: three join and see
each other, a second process of one name is refused, a killed instance's leases move within the
lease, a paused one loses its leases and comes back, and a config differing on the lease is
named (in /status and by `crawld check-config --secrets`)."""

from __future__ import annotations

import re

import pytest

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
