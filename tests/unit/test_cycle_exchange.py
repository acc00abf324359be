"""``CycleExchange``: when the probe settles a cycle, when it falls back to the all-gather, and that both
release the same responses. The ranks here are this process's own ``ControlChannel``s over a shared
board (the interface the engine uses; the Gloo implementation runs in tests/parallel)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from torchring.bench.control_plane import VirtualRank
from torchring.runtime.requests import OpType, RequestMeta

SIZE = 3


class _Board:
    """What every rank contributed to the current collective; a barrier hands out the result."""

    def __init__(self, size: int) -> None:
        self.values: list = [None] * size
        self.barrier = threading.Barrier(size)


class _ThreadChannel:
    def __init__(self, board: _Board, rank: int) -> None:
        self.board, self.rank, self.size = board, rank, len(board.values)
        self.collectives: list[str] = []

    def _collect(self, value):
        self.board.values[self.rank] = value
        self.board.barrier.wait()
        values = list(self.board.values)
        self.board.barrier.wait()
        return values

    def allgather_bytes(self, payload: bytes) -> list[bytes]:
        self.collectives.append("allgather")
        return self._collect(payload)

    def gather_and_broadcast(self, payload: bytes, combine) -> bytes:
        self.collectives.append("gather")
        gathered = self._collect(payload)
        return self._collect(combine(gathered) if self.rank == 0 else b"")[0]

    def allreduce_and(self, words: list[int], through_root: bool = False) -> list[int]:
        self.collectives.append("probe")
        result = list(words)
        for other in self._collect(words):
            result = [a & b for a, b in zip(result, other, strict=True)]
        return result

    def close(self) -> None:
        pass


def _meta(name: str, seq: int) -> RequestMeta:
    return RequestMeta(name, OpType.ALLREDUCE, "float32", (4,), reduce_op=1, seq=seq)


class _Rank(VirtualRank):
    def __init__(self, board: _Board, rank: int, gather_ranks: int = 0) -> None:
        super().__init__(rank, SIZE, 64, _ThreadChannel(board, rank), gather_ranks=gather_ranks)
        self.seq = 0

    def cycle(self, names: list[str]) -> list[str]:
        metas = [_meta(name, self.seq + i) for i, name in enumerate(names)]
        self.seq += len(names)
        return [response.name for response in self.run_cycle(metas)]


def _run(plan: list[list[list[str]]], gather_ranks: int = 0,
         make_rank: Callable[[_Board, int], _Rank] | None = None) -> tuple[list[list[list[str]]], list[_Rank]]:
    """``plan[cycle][rank]``: the names each rank submits; returns the names released per cycle and rank.
    ``make_rank(board, rank)`` builds each rank (default: a ``_Rank`` with ``gather_ranks``)."""
    board = _Board(SIZE)
    ranks = [make_rank(board, r) if make_rank else _Rank(board, r, gather_ranks) for r in range(SIZE)]
    released: list[list[list[str]]] = [[[] for _ in range(SIZE)] for _ in plan]

    def work(rank: _Rank) -> None:
        for index, cycle in enumerate(plan):
            released[index][rank.channel.rank] = rank.cycle(cycle[rank.channel.rank])

    threads = [threading.Thread(target=work, args=(rank,)) for rank in ranks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return released, ranks


def test_repeated_requests_are_settled_by_the_probe_after_one_all_gather():
    every = [["a", "b"]] * SIZE
    released, ranks = _run([every] * 5)
    assert all(sorted(names) == ["a", "b"] for cycle in released for names in cycle)
    for rank in ranks:
        # new names, then the first repeat (all-gather, which says every rank could settle), then probes
        assert rank.channel.collectives == ["allgather", "allgather", "probe", "probe", "probe"]
        assert rank.exchange.settled_cycles == 3


def test_ranks_that_announce_a_cached_request_apart_keep_their_bits_and_settle_without_an_all_gather():
    every = [["a"]] * SIZE
    late = [["a"], ["a"], []]  # rank 2 has not submitted 'a' yet
    released, ranks = _run([every, every, every, late, [[], [], ["a"]], every])
    assert released[3] == [[], [], []]  # ranks 0 and 1 keep their bit
    assert released[4] == [["a"]] * SIZE  # released once rank 2 announced it
    assert released[5] == [["a"]] * SIZE
    for rank in ranks:
        assert rank.channel.collectives[2:] == ["probe"] * 4
        assert not rank.exchange.bits_kept and rank.exchange.failed_probes == 0


def test_bits_kept_too_long_go_out_in_an_all_gather_and_are_negotiated(monkeypatch):
    from torchring.runtime.coordination import cycles
    monkeypatch.setattr(cycles, "CARRY_LIMIT_S", 0.0)
    every = [["a"]] * SIZE
    late = [["a"], ["a"], []]
    released, ranks = _run([every, every, every, late, [[], [], []], [[], [], ["a"]]])
    assert released[4] == [[], [], []] and released[5] == [["a"]] * SIZE
    for rank in ranks:
        assert rank.exchange.bits_kept is False
        # the kept bits made ranks 0 and 1 refuse to settle: the probe fell back to the all-gather
        assert rank.channel.collectives[4:6] == ["probe", "allgather"]
        assert rank.exchange.failed_probes == 1


def test_new_requests_after_the_steady_state_cost_one_all_gather_per_cycle():
    every = [["a"]] * SIZE
    released, ranks = _run([every, every, every, [["n1"]] * SIZE, [["n2"]] * SIZE, every])
    assert released[3] == [["n1"]] * SIZE and released[4] == [["n2"]] * SIZE
    for rank in ranks:
        # the probe fails once, then cycles with new requests go straight to the all-gather
        assert rank.channel.collectives[2:6] == ["probe", "probe", "allgather", "allgather"]


def test_a_cached_request_left_in_the_table_by_an_all_gather_is_completed_by_the_next_all_gather():
    every = [["a"]] * SIZE
    late = [["a"], ["a"], []]  # the first repeat goes out in an all-gather, without rank 2
    released, ranks = _run([every, late, [[], [], ["a"]], every])
    assert released[1] == [[], [], []]
    assert released[2] == [["a"]] * SIZE  # at once, not after CARRY_LIMIT_S
    for rank in ranks:
        # a probe would leave rank 2's bit outside the table where ranks 0 and 1 wait for it
        assert rank.channel.collectives[:3] == ["allgather"] * 3
        assert not rank.exchange.bits_kept


def test_announcements_through_rank_0_release_what_the_all_gather_releases():
    every = [["a", "b"]] * SIZE
    plan = [every, [["a"], ["a", "c"], ["c"]], [["c"], [], ["a"]], every, [["n"], ["n"], ["n"]], every, every]
    by_allgather, _ = _run(plan)
    through_rank_0, ranks = _run(plan, gather_ranks=SIZE)
    assert [[sorted(n) for n in cycle] for cycle in through_rank_0] == \
        [[sorted(n) for n in cycle] for cycle in by_allgather]
    for rank in ranks:
        assert "allgather" not in rank.channel.collectives and "gather" in rank.channel.collectives
        assert rank.exchange.settled_cycles > 0  # the steady state is still settled by the probe


class _SetRank(_Rank):
    """A rank of a job with process set 1 = ranks 0 and 1; names starting with ``set.`` are its operations."""

    def __init__(self, board: _Board, rank: int) -> None:
        super().__init__(board, rank)
        everyone = tuple(range(SIZE))
        self.negotiator.members_of = lambda process_set: {0: everyone, 1: (0, 1)}.get(process_set)

    def cycle(self, names: list[str]) -> list[str]:
        metas = [_meta(name, self.seq + i)._replace(process_set=1 if name.startswith("set.") else 0)
                 for i, name in enumerate(names)]
        self.seq += len(names)
        return [response.name for response in self.run_cycle(metas)]


def test_a_process_sets_repeated_operation_is_settled_by_the_probe_while_the_other_rank_submits_nothing():
    members_only = [["set.a"], ["set.a"], []]  # rank 2 is not in the set and idles
    released, ranks = _run([members_only] * 6, make_rank=_SetRank)
    # every cycle releases it on every rank (the non-member skips it when it runs), as the all-gather does;
    # before, rank 2's missing bit kept it out of every probe until CARRY_LIMIT_S (0.5 s per operation)
    assert all(names == ["set.a"] for cycle in released for names in cycle), released
    for rank in ranks:
        assert rank.channel.collectives == ["allgather", "allgather", "probe", "probe", "probe", "probe"]
        assert rank.exchange.settled_cycles == 4 and not rank.exchange.bits_kept


def test_a_process_sets_operation_waits_in_the_probe_for_its_late_member_only():
    members_only = [["set.a"], ["set.a"], []]
    late_member = [["set.a"], [], []]  # rank 1, a member, has not submitted it yet
    released, ranks = _run([members_only, members_only, members_only, late_member, [[], ["set.a"], []],
                            members_only], make_rank=_SetRank)
    assert released[3] == [[], [], []]  # rank 0 keeps its bit
    assert released[4] == [["set.a"]] * SIZE and released[5] == [["set.a"]] * SIZE
    for rank in ranks:
        assert rank.channel.collectives[2:] == ["probe"] * 4 and rank.exchange.failed_probes == 0
