"""torch's own distributed test suite as the referee, a fast representative subset in the default run: one
test per collective family (reductions with every op, coalesced forms, broadcast, reduce, gather, scatter,
all_to_all, barrier, object collectives, subgroups, coalescing, futures, DDP, sync batch norm) from the
torch wheel's distributed_test.py, run by p2pgen_lab.rigs.torch_suite against the p2pgen backend.

The whole suite, beside gloo, is `p2pgen bench torch-suite` (minutes; its table is in the README).
"""

from __future__ import annotations

import pytest

from p2pgen_lab.bench import torch_suite

SUBSET = [
    "test_all_reduce_sum", "test_all_reduce_product", "test_all_reduce_min", "test_all_reduce_coalesced_sum",
    "test_all_reduce_sum_complex", "test_broadcast", "test_reduce_sum", "test_all_gather",
    "test_all_gather_coalesced_simple", "test_gather", "test_gather_checks", "test_scatter", "test_barrier",
    "test_all_gather_object_default_pg", "test_all_gather_object_subgroup", "test_scatter_object_list",
    "test_get_rank_size_group", "test_get_future", "test_send_recv", "test_DistributedDataParallelCPU",
    "test_accumulate_gradients_no_sync",
]


@pytest.mark.timeout(240)
def test_representative_subset_of_torch_suite_passes_on_p2pgen():
    results = torch_suite.run_backend("p2pgen", 2, SUBSET, timeout_s=90, progress=False)["tests"]
    assert sorted(results) == sorted(SUBSET)
    wrong = {name: r for name, r in results.items() if r["status"] != "passed"}
    assert not wrong, wrong
