"""Local and cross ranks derived from host names when the environment does not give them."""

from torchring.runtime.coordination.topology import derive_topology


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
