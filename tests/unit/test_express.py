"""Express cycles (``runtime.coordination.express``): the probe's answer read from flags reduced with any of the
allreduce operations, which requests may carry a cycle, and ``CycleExchange`` releasing what the probe and the
all-gather release while the predicted allreduce carries the cycles. The ranks are threads of this process
(``test_cycle_exchange``'s board); the data side runs on real Gloo groups in tests/parallel/test_express.py."""

from __future__ import annotations

import functools
import operator
import random

import pytest

from torchring.reduction import ReduceOp
from torchring.runtime.coordination import express
from torchring.runtime.coordination.cycles import CycleExchange
from torchring.runtime.coordination.express import ExpressVote, expressible, read_vote, vote_flags
from torchring.runtime.coordination.negotiation import Response
from torchring.runtime.requests import OpType, RequestMeta

from .test_cycle_exchange import SIZE, _Board, _Rank, _SetRank
from .test_cycle_exchange import _run as run_ranks

_COMBINE = {ReduceOp.SUM: operator.add, ReduceOp.AVERAGE: operator.add, ReduceOp.MIN: min, ReduceOp.MAX: max,
            ReduceOp.PRODUCT: operator.mul}


@pytest.mark.parametrize("op", list(_COMBINE))
def test_the_flags_give_the_probes_answer_under_every_operation(op):
    rng = random.Random(op)
    for _ in range(50):
        span = rng.randint(0, 12)
        settles = [rng.random() < 0.8 for _ in range(SIZE)]
        masks = [rng.getrandbits(span) if span else 0 for _ in range(SIZE)]
        flags = [vote_flags(op, settle, mask, span) for settle, mask in zip(settles, masks, strict=True)]
        reduced = [functools.reduce(_COMBINE[op], column) for column in zip(*flags, strict=True)]
        vote = read_vote(op, SIZE, [float(value) for value in reduced], span)
        assert vote == ExpressVote(all(settles), functools.reduce(operator.and_, masks),
                                   functools.reduce(operator.or_, masks))


def _response(dtype="float32", shape=(1024,), reduce_op=1, device="cpu", process_set=0, group="",
              op_type=OpType.ALLREDUCE, size=SIZE) -> Response:
    metas = {r: RequestMeta("x", op_type, dtype, shape, device, reduce_op, process_set=process_set, group=group,
                            seq=0) for r in range(size)}
    return Response("x", process_set, tuple(range(size)), metas)


def test_only_small_cpu_allreduces_of_the_whole_job_with_exact_flags_go_express():
    assert expressible(_response(), SIZE)
    assert expressible(_response(shape=(express.MAX_BYTES // 4,)), SIZE)
    assert not expressible(_response(shape=(express.MAX_BYTES // 4 + 1,)), SIZE)
    assert not expressible(_response(device="cuda:0"), SIZE)
    assert not expressible(_response(reduce_op=int(ReduceOp.ADASUM)), SIZE)
    assert not expressible(_response(dtype="bool"), SIZE)
    assert not expressible(_response(dtype="bfloat16", size=300), 300)  # its flags cannot count 300 ranks
    assert expressible(_response(dtype="bfloat16"), SIZE)
    assert not expressible(_response(process_set=1), SIZE)
    assert not expressible(_response(group="g"), SIZE)
    assert not expressible(_response(op_type=OpType.BROADCAST), SIZE)


class _ExpressRank(_Rank):
    """A virtual rank whose express cycles reduce their flags (with Sum) through the board."""

    def __init__(self, board: _Board, rank: int) -> None:
        super().__init__(board, rank)
        self.exchange = CycleExchange(self.channel, self.negotiator, self.cache, express=self._express)

    def _express(self, responses: list[Response], slots: tuple[int, ...], settle: bool, mask: int,
                 span: int, foreign: int = 0) -> ExpressVote:
        self.channel.collectives.append(f"express:{'+'.join(response.name for response in responses)}")
        flags = self.channel._collect(vote_flags(ReduceOp.SUM, settle, mask, span, foreign))
        return read_vote(ReduceOp.SUM, SIZE, [float(sum(column)) for column in zip(*flags, strict=True)], span)


def _run(plan: list[list[list[str]]]) -> tuple[list[list[list[str]]], list[_ExpressRank]]:
    """``plan[cycle][rank]``: what each rank submits; returns the names released per cycle and rank."""
    return run_ranks(plan, make_rank=_ExpressRank)  # type: ignore[return-value]


def test_a_loop_of_one_allreduce_goes_express_after_the_streak():
    released, ranks = _run([[["a"]] * SIZE] * 8)
    assert all(names == ["a"] for cycle in released for names in cycle)
    for rank in ranks:
        # new, first repeat (all-gather), then the probe until 'a' followed 'a' twice; then the probe rides with 'a'
        assert rank.channel.collectives == ["allgather", "allgather", "probe", "probe", "probe", *["express:a"] * 3]
        assert rank.exchange.express_hits == 3


def test_two_allreduces_in_turn_and_a_barrier_between_go_express_each_with_the_next():
    plan = [[["a"]] * SIZE, [["b"]] * SIZE] * 6
    released, ranks = _run(plan)
    assert [cycle[0] for cycle in released] == [["a"], ["b"]] * 6
    assert ranks[0].channel.collectives[-3:] == ["express:b", "express:a", "express:b"]


def test_a_rank_that_has_not_submitted_yet_delays_the_release_and_the_others_keep_their_bits():
    every = [["a"]] * SIZE
    released, ranks = _run([every] * 6 + [[["a"], ["a"], []], [[], [], ["a"]], every])
    assert released[6] == [[], [], []] and released[7] == [["a"]] * SIZE and released[8] == [["a"]] * SIZE
    for rank in ranks:
        assert rank.channel.collectives[5:] == ["express:a"] * 4  # the late cycle is settled too: no all-gather
        assert rank.exchange.express_hits == 3 and not rank.exchange.bits_kept


def test_a_new_request_in_an_express_loop_goes_out_in_the_all_gather_of_the_same_cycle():
    every = [["a"]] * SIZE
    released, ranks = _run([every] * 6 + [[["a", "n"]] * SIZE, every])
    assert released[6] == [["a", "n"]] * SIZE or released[6] == [["n", "a"]] * SIZE
    for rank in ranks:
        assert rank.channel.collectives[5:] == ["express:a", "express:a", "allgather", "allgather"]
        assert rank.exchange.failed_probes == 1


def test_a_long_loop_stays_express_without_probes_in_between():
    released, ranks = _run([[["a"]] * SIZE] * 60)
    assert all(names == ["a"] for cycle in released for names in cycle)
    assert ranks[0].channel.collectives[5:] == ["express:a"] * 55


def test_cycles_that_release_nothing_stop_the_express_until_the_next_release():
    every = [["a"]] * SIZE
    nobody = [[]] * SIZE
    released, ranks = _run([every] * 6 + [nobody] * 4 + [every, every])
    assert released[-2] == [["a"]] * SIZE and released[-1] == [["a"]] * SIZE
    # two express cycles that released nothing, then probes until 'a' is released; then express again
    assert ranks[0].channel.collectives[5:] == ["express:a", "express:a", "express:a", "probe", "probe", "probe",
                                                "express:a"]


def test_a_loop_of_the_same_burst_goes_express_with_the_whole_burst():
    burst = [["a", "b", "c"]] * SIZE
    released, ranks = _run([burst] * 8)
    assert all(sorted(names) == ["a", "b", "c"] for cycle in released for names in cycle)
    for rank in ranks:
        assert rank.channel.collectives == ["allgather", "allgather", "probe", "probe", "probe",
                                            *["express:a+b+c"] * 3]
        assert rank.exchange.express_hits == 3


def test_a_rank_that_submitted_part_of_the_burst_gets_that_part_now_and_the_rest_with_the_others_next():
    burst = [["a", "b", "c"]] * SIZE
    part, rest = [["a", "b", "c"]] * (SIZE - 1) + [["a"]], [[]] * (SIZE - 1) + [["b", "c"]]
    released, ranks = _run([burst] * 6 + [part, rest, burst])
    assert released[6] == [["a"]] * SIZE
    assert all(sorted(names) == ["b", "c"] for names in released[7])
    assert all(sorted(names) == ["a", "b", "c"] for names in released[8])
    for rank in ranks:
        # the partial cycle is settled by the burst's allreduce too; then probes until the burst repeats
        assert rank.channel.collectives[5:] == ["express:a+b+c", "express:a+b+c", "probe", "probe"]
        assert not rank.exchange.bits_kept


def test_allreduces_that_one_allreduce_cannot_reduce_together_carry_no_cycle():
    assert express.carries_together([_response(), _response(shape=(8,))], SIZE)
    assert not express.carries_together([_response(), _response(dtype="float64")], SIZE)
    assert not express.carries_together([_response(), _response(reduce_op=int(ReduceOp.MAX))], SIZE)
    assert not express.carries_together([], SIZE)
    quarter = express.MAX_BYTES // 16  # float32 elements in a quarter of the limit
    assert express.carries_together([_response(shape=(quarter,))] * 4, SIZE)
    assert not express.carries_together([_response(shape=(quarter,))] * 4 + [_response(shape=(1,))], SIZE)


def test_a_loop_with_one_other_release_per_pass_keeps_going_express():
    every_pass = [[["a"]] * SIZE] * 4 + [[["z"]] * SIZE]
    released, ranks = _run(every_pass * 6)
    assert [cycle[0] for cycle in released] == [["a"], ["a"], ["a"], ["a"], ["z"]] * 6
    for rank in ranks:
        # once the streaks are learnt no cycle takes the probe: z after the fourth a is an exception to a's pattern
        assert rank.channel.collectives[-10:] == ["express:a"] * 10, rank.channel.collectives


def test_a_loop_whose_ranks_never_arrive_together_stays_with_the_probe():
    """Each pass, one rank submits a cycle after the others: an express cycle would miss every other cycle,
    sending its carrier for nothing, so the plan never goes express (it did before, missing half its cycles)."""
    ahead, behind = [["a"]] * (SIZE - 1) + [[]], [[]] * (SIZE - 1) + [["a"]]
    released, ranks = _run([[["a"]] * SIZE] * 2 + [ahead, behind] * 8)
    assert [cycle[0] for cycle in released[2:]] == [[], ["a"]] * 8
    for rank in ranks:
        assert not any(name.startswith("express") for name in rank.channel.collectives), rank.channel.collectives
        assert rank.exchange.express_cycles == 0


def test_a_loop_that_falls_out_of_step_for_a_while_goes_express_again_once_its_ranks_arrive_together():
    every = [["a"]] * SIZE
    ahead, behind = [["a"]] * (SIZE - 1) + [[]], [[]] * (SIZE - 1) + [["a"]]
    released, ranks = _run([every] * 6 + [ahead, behind] * 4 + [every] * 6)
    assert all(names == ["a"] for cycle in released[-6:] for names in cycle)
    for rank in ranks:
        assert rank.channel.collectives[-2:] == ["express:a"] * 2, rank.channel.collectives
        assert "probe" in rank.channel.collectives[11:]  # out of step, the probe took over


class _ExpressSetRank(_SetRank):
    """An express rank (as ``_ExpressRank``) of a job with process set 1 = ranks 0 and 1."""

    def __init__(self, board: _Board, rank: int) -> None:
        super().__init__(board, rank)
        self.exchange = CycleExchange(self.channel, self.negotiator, self.cache, express=self._express)

    _express = _ExpressRank._express


def test_a_process_sets_operation_beside_a_loop_that_goes_express_is_released_by_the_express_cycles():
    plan = [[["g", "set.a"], ["g", "set.a"], ["g"]]] * 9  # rank 2 is not in the set
    released, ranks = run_ranks(plan, make_rank=_ExpressSetRank)
    for cycle in released:
        assert [sorted(names) for names in cycle] == [["g", "set.a"]] * SIZE, released
    for rank in ranks:
        # new, first repeat (all-gather), the probe until the streak, then express cycles that release both
        assert rank.channel.collectives == ["allgather", "allgather", "probe", "probe", "probe", *["express:g"] * 4]
        assert rank.exchange.express_hits == 4 and rank.exchange.failed_probes == 0
