"""How ``torchring bench`` lays out the real Horovod's ranks inside its own job (``bench.horovod_peer``)."""

from __future__ import annotations

from torchring.bench.horovod_peer import _slots


def test_one_host_gives_every_rank_a_local_rank_and_one_cross_rank():
    assert _slots(["a", "a"]) == [(0, 2, 0, 1), (1, 2, 0, 1)]


def test_hosts_in_rank_order_give_horovodruns_local_and_cross_ranks():
    # ranks 0,1 on a, 2 on b: local rank 0 exists on both hosts (cross size 2), local rank 1 only on a
    assert _slots(["a", "a", "b"]) == [(0, 2, 0, 2), (1, 2, 0, 1), (0, 1, 1, 2)]


def test_interleaved_hosts_keep_each_ranks_own_host():
    assert _slots(["a", "b", "a", "b"]) == [(0, 2, 0, 2), (0, 2, 1, 2), (1, 2, 0, 2), (1, 2, 1, 2)]
