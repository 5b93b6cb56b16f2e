from tests import slowest


def test_slices_follow_xdist_arithmetic() -> None:
    assert slowest.slice_sizes(10, 3) == [3, 3, 4]
    assert sum(slowest.slice_sizes(3193, 3)) == 3193


def test_long_tests_open_each_slice_balanced_and_nothing_is_lost() -> None:
    ids = [f"tests/x.py::t{i}" for i in range(12)]
    ids[3] = "tests/tracker/test_tracker_lifecycle.py::test_lifecycle[postgres]"  # 70
    ids[7] = "tests/crawlapi/test_monitor_cluster.py::test_a"  # 65
    ids[11] = "tests/jobs/test_crash.py::test_kill_9_mid_stream[sqlite]"  # 35
    ordered = slowest.deal(ids, ids, 2)
    assert sorted(ordered) == sorted(ids)
    first, second = ordered[:6], ordered[6:]
    assert first[0] == ids[3] and first[1] == "tests/x.py::t0"
    assert second[:2] == [ids[7], ids[11]]  # 65 + 35 against 70: the lighter slice takes it
    assert [i for i in ordered if slowest.weight(i) == 0] == [
        i for i in ids if slowest.weight(i) == 0
    ]


def test_outside_xdist_the_order_is_kept() -> None:
    ids = ["tests/tracker/test_tracker_lifecycle.py::test_lifecycle[sqlite]", "tests/a.py::b"]
    assert slowest.deal(ids, ids, 0) == ids
    assert slowest.deal(ids, ids, 1) == ids
