"""The negotiation table and the cross-rank checks, without any process group."""

from torchring.reduction import ReduceOp
from torchring.runtime.coordination.negotiation import Negotiator, check_consistency
from torchring.runtime.requests import OpType, RequestMeta


def negotiator(size: int, sets: dict[int, tuple[int, ...]] | None = None) -> Negotiator:
    known = {0: tuple(range(size)), **(sets or {})}
    return Negotiator(size, known.get)


def by_rank(*metas):
    return dict(enumerate(metas))


def allreduce(name, shape=(4,), dtype="float32", seq=0, op=ReduceOp.SUM, **kw):
    return RequestMeta(name, OpType.ALLREDUCE, dtype, shape, "cpu", int(op), seq=seq, **kw)


def test_request_is_ready_only_when_every_rank_submitted_it():
    table = negotiator(3)
    table.record(0, [allreduce("a")])
    table.record(2, [allreduce("a")])
    assert table.take_ready() == []
    assert table.missing_ranks((0, "a"), table.pending[(0, "a")]) == [1]
    table.record(1, [allreduce("a")])
    (response,) = table.take_ready()
    assert response.name == "a" and response.error is None and response.members == (0, 1, 2)
    assert table.pending == {}


def test_ready_requests_follow_rank_zero_submission_order():
    table = negotiator(2)
    table.record(0, [allreduce("x", seq=2), allreduce("y", seq=1)])
    table.record(1, [allreduce("y", seq=7), allreduce("x", seq=8)])
    assert [r.name for r in table.take_ready()] == ["y", "x"]


def test_shape_mismatch_names_tensor_and_each_rank():
    error = check_consistency("w", by_rank(allreduce("w", (4,)), allreduce("w", (5,)), allreduce("w", (4,))))
    assert error == "Mismatched allreduce tensor shapes for tensor 'w': ranks 0,2 sent [4]; rank 1 sent [5]."


def test_dtype_op_and_scale_mismatches():
    assert "data types" in check_consistency("w", by_rank(allreduce("w"), allreduce("w", dtype="float64")))
    assert "reduction ops" in check_consistency("w", by_rank(allreduce("w"), allreduce("w", op=ReduceOp.MAX)))
    assert "prescale" in check_consistency("w", by_rank(allreduce("w"), allreduce("w", prescale_factor=2.0)))


def test_operation_mismatch():
    broadcast = RequestMeta("w", OpType.BROADCAST, "float32", (4,), "cpu", root_rank=0)
    assert check_consistency("w", by_rank(allreduce("w"), broadcast)) == (
        "Mismatched operations for tensor 'w': rank 0 sent allreduce; rank 1 sent broadcast.")


def test_allgather_first_dimension_may_differ_but_not_the_rest():
    def gather(shape):
        return RequestMeta("g", OpType.ALLGATHER, "float32", shape, "cpu")
    assert check_consistency("g", by_rank(gather((1, 3)), gather((5, 3)))) is None
    assert "beyond the first dimension" in check_consistency("g", by_rank(gather((1, 3)), gather((1, 4))))
    assert "number of dimensions" in check_consistency("g", by_rank(gather((1, 3)), gather((3,))))


def test_broadcast_root_mismatch():
    def bcast(root):
        return RequestMeta("b", OpType.BROADCAST, "float32", (2,), "cpu", root_rank=root)
    assert "root ranks" in check_consistency("b", by_rank(bcast(0), bcast(1)))


def test_mismatch_is_reported_as_a_response_with_an_error():
    table = negotiator(2)
    table.record(0, [allreduce("a", (2,))])
    table.record(1, [allreduce("a", (3,))])
    (response,) = table.take_ready()
    assert "rank 1 sent [3]" in response.error


def test_process_set_request_is_ready_when_its_members_submitted():
    table = negotiator(3, {1: (0, 2)})
    table.record(0, [allreduce("a", process_set=1)])
    assert table.take_ready() == []
    table.record(2, [allreduce("a", process_set=1)])
    (response,) = table.take_ready()
    assert response.members == (0, 2) and response.process_set == 1


def test_same_name_in_two_process_sets_are_separate_requests():
    table = negotiator(2, {1: (1,)})
    table.record(1, [allreduce("a", process_set=1), allreduce("a")])
    assert [r.process_set for r in table.take_ready()] == [1]
    table.record(0, [allreduce("a")])
    assert [r.process_set for r in table.take_ready()] == [0]


def test_joined_rank_lets_allreduce_run_and_join_returns_last_rank():
    table = negotiator(3)
    join = RequestMeta("join", OpType.JOIN)
    table.record(1, [join])
    table.record(0, [allreduce("a")])
    table.record(2, [allreduce("a")])
    (response,) = table.take_ready()
    assert response.name == "a" and response.error is None and sorted(response.metas) == [0, 2]
    table.record(2, [join])
    assert table.take_ready() == []
    table.record(0, [join])  # rank 0 joins in a later cycle: it is the last
    (done,) = table.take_ready()
    assert done.op_type is OpType.JOIN and done.last_joined == 0
    assert table.joined == []


def test_joined_rank_cannot_take_part_in_allgather_broadcast_or_alltoall():
    table = negotiator(2)
    table.record(1, [RequestMeta("join", OpType.JOIN)])
    table.record(0, [RequestMeta("x", OpType.ALLTOALL, "float32", (2,), "cpu", splits=(1, 1)),
                     RequestMeta("g", OpType.ALLGATHER, "float32", (2,), "cpu"),
                     RequestMeta("b", OpType.BROADCAST, "float32", (2,), "cpu", root_rank=0)])
    responses = table.take_ready()
    assert len(responses) == 3
    assert all(r.error_kind == "joined" and "already called join()" in r.error for r in responses)


def test_group_is_released_only_when_complete():
    table = negotiator(2)
    first = allreduce("g.0", group="g", group_size=2)
    second = allreduce("g.1", group="g", group_size=2)
    table.record(0, [first, second])
    table.record(1, [first])
    assert table.take_ready() == []
    table.record(1, [second])
    assert sorted(r.name for r in table.take_ready()) == ["g.0", "g.1"]


def test_unknown_process_set_is_an_invalid_request():
    table = negotiator(2)
    table.record(0, [allreduce("a", process_set=9)])
    (response,) = table.take_ready()
    assert response.error_kind == "invalid"


def test_stall_hint_names_another_operation_submitted_under_the_same_name():
    negotiator = Negotiator(2, lambda process_set: (0, 1))
    negotiator.record(0, [RequestMeta("allreduce.grad", OpType.ALLREDUCE, "float32", (3,), reduce_op=1)])
    negotiator.record(1, [RequestMeta("broadcast.grad", OpType.BROADCAST, "float32", (3,), root_rank=0)])
    assert negotiator.take_ready() == []
    key = (0, "allreduce.grad")
    assert negotiator.same_name_hint(key, negotiator.missing_ranks(key, negotiator.pending[key])) == \
        "; rank 1 submitted broadcast.grad instead"
    assert negotiator.same_name_hint((0, "broadcast.grad"), [1]) == ""
