"""Rank discovery: one class per launcher, detected from the environment."""

import socket
import sys

import pytest

from torchring.environments import (
    LaunchEnvironmentError,
    MPIEnvironment,
    SingleProcessEnvironment,
    SlurmEnvironment,
    TorchringLauncherEnvironment,
    TorchrunEnvironment,
    detect_environment,
    mpi_bootstrap,
)
from torchring.environments.slurm import derived_port, first_host
from torchring.network import interface_addresses


def test_no_variables_means_a_single_process():
    environment = detect_environment({})
    assert isinstance(environment, SingleProcessEnvironment)
    info = environment.rank_info()
    assert (info.rank, info.size, info.local_rank, info.cross_size) == (0, 1, 0, 1)
    assert environment.rendezvous().host is None


def test_torchring_launcher_variables():
    env = {"TORCHRING_RANK": "2", "TORCHRING_SIZE": "4", "TORCHRING_LOCAL_RANK": "0", "TORCHRING_LOCAL_SIZE": "2",
           "TORCHRING_CROSS_RANK": "1", "TORCHRING_CROSS_SIZE": "2", "TORCHRING_STORE_ADDR": "10.0.0.1",
           "TORCHRING_STORE_PORT": "1234", "RANK": "2", "WORLD_SIZE": "4"}
    environment = detect_environment(env)
    assert isinstance(environment, TorchringLauncherEnvironment)
    info = environment.rank_info()
    assert (info.rank, info.size, info.local_rank, info.local_size, info.cross_rank, info.cross_size) == (
        2, 4, 0, 2, 1, 2)
    rendezvous = environment.rendezvous()
    assert (rendezvous.host, rendezvous.port, rendezvous.serve_store) == ("10.0.0.1", 1234, False)


def test_horovod_variable_names_are_accepted():
    env = {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2",
           "MASTER_ADDR": "h", "MASTER_PORT": "5"}
    environment = detect_environment(env)
    assert isinstance(environment, TorchringLauncherEnvironment)
    assert environment.rank_info().local_rank == 1
    assert environment.rendezvous().port == 5


def test_torchrun_variables_and_agent_store():
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
           "MASTER_ADDR": "node0", "MASTER_PORT": "29400", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    environment = detect_environment(env)
    assert isinstance(environment, TorchrunEnvironment)
    info = environment.rank_info()
    assert (info.rank, info.size, info.local_rank, info.local_size, info.cross_rank, info.cross_size) == (
        3, 4, 1, 2, 1, 2)
    assert environment.rendezvous().serve_store is False


def test_torchrun_style_rank_zero_serves_the_store_without_an_agent():
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "pod-0", "MASTER_PORT": "23456"}
    rendezvous = detect_environment(env).rendezvous()
    assert (rendezvous.host, rendezvous.port, rendezvous.serve_store) == ("pod-0", 23456, True)


def test_slurm_job_step():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
           "SLURM_STEP_NODELIST": "gpu[07-10]", "SLURM_JOB_ID": "4242"}
    environment = detect_environment(env)
    assert isinstance(environment, SlurmEnvironment)
    assert environment.rank_info().rank == 5 and environment.rank_info().local_rank == 1
    rendezvous = environment.rendezvous()
    assert rendezvous.host == "gpu07" and rendezvous.port == derived_port(4242, 0)
    assert derived_port(4242, 1) != derived_port(4242, 0)  # two steps of one job at once


def test_slurm_allocation_without_a_step_is_not_a_job():
    assert isinstance(detect_environment({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}), SingleProcessEnvironment)


@pytest.mark.parametrize("nodelist,first", [
    ("node1", "node1"), ("gpu[03-05,09],cpu1", "gpu03"), ("a[1,2]", "a1"), ("x-[010-020]-ib", "x-010-ib"),
])
def test_slurm_first_host(nodelist, first):
    assert first_host(nodelist) == first


def test_open_mpi_without_an_address_or_mpi4py_says_what_to_install_or_set(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py fails, as where it is not installed
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    environment = detect_environment(env)
    assert isinstance(environment, MPIEnvironment)
    assert environment.rank_info().local_size == 2
    with pytest.raises(LaunchEnvironmentError, match=r"install mpi4py .*torchring\[mpi\].*-x MASTER_ADDR="):
        environment.prepare()
    env.update(MASTER_ADDR="head", MASTER_PORT="7000")
    given = detect_environment(env)
    given.prepare()  # an address given: nothing to learn over MPI
    assert given.rendezvous().host == "head"


def test_rank_0s_store_is_reached_over_loopback_on_its_host_and_never_at_an_address_this_host_holds():
    assert mpi_bootstrap._reachable(socket.gethostname(), ["198.51.100.7"]) == "127.0.0.1"
    own = [address for address in interface_addresses().values() if not address.startswith("127.")]
    with pytest.raises(RuntimeError, match="none of rank 0's addresses .* MASTER_ADDR"):
        mpi_bootstrap._reachable("another-host", own)


def test_pmi_variables():
    env = {"PMI_RANK": "3", "PMI_SIZE": "4", "MASTER_ADDR": "head", "MASTER_PORT": "7000"}
    info = detect_environment(env).rank_info()
    assert (info.rank, info.size, info.local_rank) == (3, 4, None)


def test_non_integer_variable_is_named_in_the_error():
    with pytest.raises(LaunchEnvironmentError, match="WORLD_SIZE='two'"):
        detect_environment({"RANK": "0", "WORLD_SIZE": "two"}).rank_info()
