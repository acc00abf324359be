"""Local and cross ranks derived from host names when the environment does not give them."""

from torchring.runtime.coordination.topology import derive_topologies, derive_topology


def test_derived_from_host_names():
    everyone = [("a", None, None, None, None)] * 2 + [("b", None, None, None, None)] * 2
    topology = derive_topology(3, everyone)
    assert (topology.local_rank, topology.local_size, topology.cross_rank, topology.cross_size) == (1, 2, 1, 2)


def test_environment_values_win():
    everyone = [("x", 0, 1, 0, 1), ("x", 0, 1, 1, 2)]
    topology = derive_topology(1, everyone)
    assert (topology.local_rank, topology.local_size, topology.cross_rank, topology.cross_size) == (0, 1, 1, 2)


def test_uneven_hosts():
    everyone = [("a", None, None, None, None)] * 3 + [("b", None, None, None, None)]
    assert derive_topology(1, everyone).cross_size == 1
    assert derive_topology(3, everyone).cross_rank == 1 and derive_topology(3, everyone).cross_size == 2


def test_homogeneity():
    assert derive_topology(0, [("a", None, None, None, None)] * 2 + [("b", None, None, None, None)] * 2).homogeneous
    assert not derive_topology(0, [("a", None, None, None, None)] * 3 + [("b", None, None, None, None)]).homogeneous


def test_every_ranks_topology_at_once_matches_the_environment_and_scales():
    # 512 hosts x 8 ranks, host names only: local ranks by position on the host, cross ranks by local rank
    everyone = [(f"host{r // 8}", None, None, None, None) for r in range(4096)]
    topologies = derive_topologies(everyone)
    assert [(t.local_rank, t.local_size, t.cross_rank, t.cross_size) for t in topologies[:9]] == \
        [(i, 8, 0, 512) for i in range(8)] + [(0, 8, 1, 512)]
    assert topologies[4095].cross_rank == 511 and all(t.homogeneous for t in topologies)
    # what the environment says stands (torchrun's LOCAL_RANK / LOCAL_WORLD_SIZE)
    given = [("h", 1, 2, None, None), ("h", 0, 2, None, None)]
    assert [(t.local_rank, t.cross_rank, t.cross_size) for t in derive_topologies(given)] == [(1, 0, 1), (0, 0, 1)]
