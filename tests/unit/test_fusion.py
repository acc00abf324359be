"""The fusion plan: which negotiated allreduces share one buffer."""

from torchring.reduction import ReduceOp
from torchring.runtime.coordination.fusion import BatchPlanner, plan_batches
from torchring.runtime.coordination.negotiation import Response
from torchring.runtime.requests import OpType, RequestMeta


def response(name, shape=(4,), dtype="float32", op=ReduceOp.SUM, op_type=OpType.ALLREDUCE, members=(0, 1),
             submitted=(0, 1), error=None, process_set=0):
    meta = RequestMeta(name, op_type, dtype, shape, "cpu", int(op), process_set=process_set)
    return Response(name, process_set, members, {rank: meta for rank in submitted}, error)


def names(batches):
    return [[r.name for r in batch] for batch in batches]


def test_same_kind_allreduces_are_fused_in_order():
    batches = plan_batches([response("a"), response("b"), response("c")], threshold=1024)
    assert names(batches) == [["a", "b", "c"]]


def test_threshold_splits_batches_and_zero_turns_fusion_off():
    responses = [response("a", (100,)), response("b", (100,)), response("c", (100,))]
    assert names(plan_batches(responses, threshold=800)) == [["a", "b"], ["c"]]
    assert names(plan_batches(responses, threshold=0)) == [["a"], ["b"], ["c"]]


def test_different_dtype_op_or_process_set_are_not_fused_together():
    responses = [response("a"), response("b", dtype="float64"), response("c", op=ReduceOp.MAX),
                 response("d", process_set=1), response("e")]
    assert names(plan_batches(responses, threshold=1 << 20)) == [["a", "e"], ["b"], ["c"], ["d"]]


def test_errors_other_ops_and_joined_members_run_alone():
    responses = [response("a"), response("bad", error="Mismatched"), response("g", op_type=OpType.ALLGATHER),
                 response("joined", submitted=(0,)), response("b")]
    assert names(plan_batches(responses, threshold=1 << 20)) == [["a", "b"], ["bad"], ["g"], ["joined"]]


def test_large_tensors_are_reduced_alone_in_place():
    responses = [response("small", (10,)), response("large", (300_000,)), response("tiny", (2,))]
    assert names(plan_batches(responses, threshold=128 << 20)) == [["small", "tiny"], ["large"]]
    assert names(plan_batches(responses, threshold=128 << 20, separate_at=1 << 30)) == [["small", "large", "tiny"]]


def test_the_planner_hands_back_its_last_plan_for_the_same_responses_only():
    planner = BatchPlanner(threshold=1024)
    responses = [response("a"), response("b"), response("c")]
    first = planner.plan(responses)
    assert names(first) == names(plan_batches(responses, threshold=1024))
    assert planner.plan(list(responses)) is first  # the same objects again: the remembered plan
    other = [response("a"), response("b"), response("c")]  # equal names, other objects: planned afresh
    assert planner.plan(other) is not first and names(planner.plan(other)) == names(first)
    assert names(planner.plan(responses[:1])) == [["a"]]
