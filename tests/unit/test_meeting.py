"""The ranks' meeting in a real TCPStore (threads as ranks): every rank's topology and rank 0's shared
values, read by every rank itself (small jobs) or answered by rank 0 (large ones), a rank that never comes
named, a value another process wrote refused."""

import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from tests.ports import free_port
from torchring.environments import RankInfo
from torchring.runtime import meeting
from torchring.runtime.meeting import meet
from torchring.runtime.peer_names import decode_host_table
from torchring.store_auth import AuthenticatedStore, JobCredentials


@pytest.fixture(params=["every rank reads", "rank 0 answers"])
def server(request, monkeypatch):
    if request.param == "rank 0 answers":  # as in a job larger than DIRECT_MEETING_MAX_RANKS
        monkeypatch.setattr(meeting, "DIRECT_MEETING_MAX_RANKS", 1)
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10),
                          wait_for_workers=False)
    yield port, store


def _meet_all(port, infos, credentials, timeout=timedelta(seconds=10)):
    results, errors = [None] * len(infos), [None] * len(infos)

    def run(index, info):
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout, wait_for_workers=False)
        try:
            results[index] = meet(AuthenticatedStore(client, credentials), "gen1", info, (info.rank * 10, 7), timeout)
        except RuntimeError as error:
            errors[index] = str(error)

    threads = [threading.Thread(target=run, args=(i, info)) for i, info in enumerate(infos)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results, errors


def test_every_rank_learns_its_topology_and_rank_0s_shared_values(server):
    port, _ = server
    hosts = ["a", "a", "b", "b"]
    infos = [RankInfo(rank=r, size=4, hostname=hosts[r]) for r in range(4)]
    credentials = JobCredentials.new()
    results, errors = _meet_all(port, infos, credentials)
    assert errors == [None] * 4
    topologies = [result[0] for result in results]
    assert [(t.local_rank, t.local_size, t.cross_rank, t.cross_size) for t in topologies] == \
        [(0, 2, 0, 2), (1, 2, 0, 2), (0, 2, 1, 2), (1, 2, 1, 2)]
    assert all(t.homogeneous and t.size == 4 for t in topologies)
    assert results[0][1] == [(0, 7), (10, 7), (20, 7), (30, 7)]  # rank 0 sees everyone's (it warns on mismatch)
    assert all(result[1] == [(0, 7)] for result in results[1:])  # the others get rank 0's
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10), wait_for_workers=False)
    client.wait(["gen1/hosts"])  # rank 0's set is not answered: another client sees it once the server has it
    assert decode_host_table(AuthenticatedStore(client, credentials).get("gen1/hosts")) == {"a": [0, 1], "b": [2, 3]}


def test_a_rank_that_never_comes_is_named_on_every_rank_that_waited(server):
    port, _ = server
    infos = [RankInfo(rank=r, size=3, hostname="h") for r in (0, 1)]  # rank 2 never calls init()
    _, errors = _meet_all(port, infos, JobCredentials.new(), timeout=timedelta(seconds=1))
    assert all("rank(s) [2] of 3 never called hvd.init()" in error for error in errors)


def test_an_arrival_another_process_wrote_is_refused_with_its_key(server):
    port, store = server
    store.set("gen1/arrived/1", b'[["h", null, null, null, null], [1, 2]]')  # unsigned: not from the job
    _, errors = _meet_all(port, [RankInfo(rank=0, size=2, hostname="h")], JobCredentials.new())
    assert "'gen1/arrived/1'" in errors[0] and "not written by this job" in errors[0]


def test_before_arrival_runs_before_the_arrival_is_posted(server):
    port, _ = server
    credentials = JobCredentials.new()
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10), wait_for_workers=False)
    seen = []

    def before_arrival():  # the last rank to arrive does its start-up work before the others wake up
        seen.append(client.check(["gen1/arrived/1"]))

    with pytest.raises(RuntimeError, match=r"rank\(s\) \[0\] of 2 never called hvd.init\(\)"):
        meet(AuthenticatedStore(client, credentials), "gen1", RankInfo(rank=1, size=2, hostname="a"), (0,),
             timedelta(seconds=1), before_arrival=before_arrival)
    assert seen == [False]
    assert client.check(["gen1/arrived/1"])  # posted after it
