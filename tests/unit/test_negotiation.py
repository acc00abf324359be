"""The negotiation table and the cross-rank checks, without any process group."""

from torchring.reduction import ReduceOp
from torchring.runtime.negotiation import Negotiator, check_consistency
from torchring.runtime.requests import OpType, RequestMeta


def allreduce(name, shape=(4,), dtype="float32", seq=0, op=ReduceOp.SUM, **kw):
    return RequestMeta(name, OpType.ALLREDUCE, dtype, shape, "cpu", int(op), seq=seq, **kw)


def test_request_is_ready_only_when_every_rank_submitted_it():
    negotiator = Negotiator(3)
    negotiator.record(0, [allreduce("a")])
    negotiator.record(2, [allreduce("a")])
    assert negotiator.take_ready() == []
    assert negotiator.missing_ranks(negotiator.pending["a"]) == [1]
    negotiator.record(1, [allreduce("a")])
    (response,) = negotiator.take_ready()
    assert response.name == "a" and response.error is None
    assert negotiator.pending == {}


def test_ready_requests_follow_rank_zero_submission_order():
    negotiator = Negotiator(2)
    negotiator.record(0, [allreduce("x", seq=2), allreduce("y", seq=1)])
    negotiator.record(1, [allreduce("y", seq=7), allreduce("x", seq=8)])
    assert [r.name for r in negotiator.take_ready()] == ["y", "x"]


def test_shape_mismatch_names_tensor_and_each_rank():
    error = check_consistency("w", [allreduce("w", (4,)), allreduce("w", (5,)), allreduce("w", (4,))])
    assert error == "Mismatched allreduce tensor shapes for tensor 'w': ranks 0,2 sent [4]; rank 1 sent [5]."


def test_dtype_op_and_scale_mismatches():
    assert "data types" in check_consistency("w", [allreduce("w"), allreduce("w", dtype="float64")])
    assert "reduction ops" in check_consistency("w", [allreduce("w"), allreduce("w", op=ReduceOp.MAX)])
    assert "prescale" in check_consistency("w", [allreduce("w"), allreduce("w", prescale_factor=2.0)])


def test_operation_mismatch():
    broadcast = RequestMeta("w", OpType.BROADCAST, "float32", (4,), "cpu", root_rank=0)
    assert check_consistency("w", [allreduce("w"), broadcast]) == (
        "Mismatched operations for tensor 'w': rank 0 sent allreduce; rank 1 sent broadcast.")


def test_allgather_first_dimension_may_differ_but_not_the_rest():
    def gather(shape):
        return RequestMeta("g", OpType.ALLGATHER, "float32", shape, "cpu")
    assert check_consistency("g", [gather((1, 3)), gather((5, 3))]) is None
    assert "beyond the first dimension" in check_consistency("g", [gather((1, 3)), gather((1, 4))])
    assert "number of dimensions" in check_consistency("g", [gather((1, 3)), gather((3,))])


def test_broadcast_root_mismatch():
    def bcast(root):
        return RequestMeta("b", OpType.BROADCAST, "float32", (2,), "cpu", root_rank=root)
    assert "root ranks" in check_consistency("b", [bcast(0), bcast(1)])


def test_mismatch_is_reported_as_a_response_with_an_error():
    negotiator = Negotiator(2)
    negotiator.record(0, [allreduce("a", (2,))])
    negotiator.record(1, [allreduce("a", (3,))])
    (response,) = negotiator.take_ready()
    assert "rank 1 sent [3]" in response.error
