"""bench.dra_alloc_cost's inputs and table, without Go: the NIC shapes are
the published ones less what each drops, and the table is the runs' medians
against the GPU driver alone."""

from __future__ import annotations

from bench.dra_alloc_cost import NODE_LEVEL, shapes, table


def test_the_nic_shapes_are_the_published_ones_less_what_each_drops() -> None:
    got = shapes()
    assert len(got["gpu"]) == 8 and all(d["attributes"]["type"] == {"string": "gpu"}
                                        for d in got["gpu"])
    published, bare, eight = got["shapes"].values()
    assert len(published) == len(bare) == len(eight) == 8
    assert all(k in published[0]["attributes"] for k in NODE_LEVEL)
    assert set(bare[0]["attributes"]) == set(published[0]["attributes"]) - set(NODE_LEVEL)
    assert len(eight[0]["attributes"]) == 8 and eight[0]["capacity"] == published[0]["capacity"]


def test_the_table_is_the_median_against_the_gpu_driver_alone() -> None:
    runs = [{"": {"free": 20.0, "full": 5.0}, "nic": {"free": 30.0, "full": 90.0}},
            {"": {"free": 22.0, "full": 5.0}, "nic": {"free": 33.0, "full": 80.0}},
            {"": {"free": 18.0, "full": 6.0}, "nic": {"free": 31.0, "full": 85.0}}]
    lines = table(runs).splitlines()
    assert lines[2] == "| GPU driver alone (8 whole GPUs) | 20.0 | 1.00 | 5.0 | 1.00 |"
    assert lines[3] == "| nic | 31.0 | 1.55 | 85.0 | 17.00 |"
