"""The response cache: identical slots on every rank, one bit per repeated request, LRU reuse."""

from __future__ import annotations

from torchring.runtime.coordination.negotiation import Response
from torchring.runtime.coordination.response_cache import ResponseCache
from torchring.runtime.requests import OpType, RequestMeta


def meta(name: str, shape=(4,), seq: int = 0, **fields) -> RequestMeta:
    return RequestMeta(name=name, op_type=fields.pop("op_type", OpType.ALLREDUCE), dtype="float32", shape=shape,
                       reduce_op=1, seq=seq, **fields)


def response(metas: dict[int, RequestMeta], error: str | None = None) -> Response:
    first = metas[min(metas)]
    return Response(first.name, 0, (0, 1), metas, error)


def two_ranks(capacity: int = 8) -> list[ResponseCache]:
    return [ResponseCache(capacity, rank) for rank in (0, 1)]


def record_everywhere(caches: list[ResponseCache], *responses: Response) -> None:
    for cache in caches:
        for item in responses:
            cache.record(item)


def test_a_repeated_request_is_one_bit_and_decodes_to_the_senders_metadata():
    caches = two_ranks()
    mask, misses = caches[0].encode([meta("a", seq=3)])
    assert mask == b"" and [m.name for m in misses] == ["a"]
    record_everywhere(caches, response({0: meta("a", seq=3), 1: meta("a", seq=7)}))
    mask, misses = caches[1].encode([meta("a", seq=11)])
    assert misses == () and len(mask) == 1
    (decoded,) = caches[0].decode(1, mask)
    assert decoded._replace(seq=0) == meta("a")
    assert caches[1].hits == 1 and caches[1].misses == 0


def test_different_metadata_is_not_a_hit():
    caches = two_ranks()
    record_everywhere(caches, response({0: meta("a"), 1: meta("a")}))
    mask, misses = caches[0].encode([meta("a", shape=(5,)), meta("b")])
    assert mask == b"" and len(misses) == 2
    mask, misses = caches[0].encode([meta("a")._replace(reduce_op=2)])
    assert mask == b"" and len(misses) == 1


def test_errors_joined_ranks_and_control_ops_are_not_cached():
    caches = two_ranks()
    record_everywhere(
        caches,
        response({0: meta("bad"), 1: meta("bad", shape=(2,))}, error="Mismatched"),
        Response("joined", 0, (0, 1), {0: meta("joined")}),
        response({0: meta("j", op_type=OpType.JOIN), 1: meta("j", op_type=OpType.JOIN)}),
    )
    assert len(caches[0]) == 0


def test_a_barrier_every_rank_took_part_in_is_cached_like_a_data_operation():
    caches = two_ranks()
    record_everywhere(caches, response({0: meta("barrier", op_type=OpType.BARRIER),
                                        1: meta("barrier", op_type=OpType.BARRIER)}))
    for cache in caches:
        mask, misses = cache.encode([meta("barrier", op_type=OpType.BARRIER)])
        assert not misses and mask == b"\x01"


def test_slots_are_reused_least_recently_used_first_on_every_rank_alike():
    caches = two_ranks(capacity=2)
    record_everywhere(caches, response({0: meta("a"), 1: meta("a")}), response({0: meta("b"), 1: meta("b")}))
    record_everywhere(caches, response({0: meta("a"), 1: meta("a")}))  # a used again: b is the oldest
    record_everywhere(caches, response({0: meta("c"), 1: meta("c")}))  # evicts b, takes its slot
    for cache in caches:
        _, misses = cache.encode([meta("a"), meta("b"), meta("c")])
        assert [m.name for m in misses] == ["b"]
    mask0, _ = caches[0].encode([meta("c")])
    mask1, _ = caches[1].encode([meta("c")])
    assert mask0 == mask1 == (1 << 1).to_bytes(1, "little")


def test_capacity_zero_turns_the_cache_off():
    caches = two_ranks(capacity=0)
    record_everywhere(caches, response({0: meta("a"), 1: meta("a")}))
    assert caches[0].encode([meta("a")]) == (b"", (meta("a"),))


def test_allgather_entries_keep_each_ranks_own_shape():
    caches = two_ranks()
    gather = {0: meta("g", shape=(2, 3), op_type=OpType.ALLGATHER),
              1: meta("g", shape=(5, 3), op_type=OpType.ALLGATHER)}
    record_everywhere(caches, response(gather))
    mask, misses = caches[1].encode([meta("g", shape=(5, 3), op_type=OpType.ALLGATHER)])
    assert misses == ()
    assert caches[0].decode(1, mask)[0].shape == (5, 3)


def test_requests_every_rank_repeats_skip_negotiation_and_leave_the_rest_to_it():
    caches = two_ranks()
    grouped = {rank: meta("g", group="grp", group_size=1) for rank in (0, 1)}
    record_everywhere(caches, response({0: meta("a"), 1: meta("a")}), response({0: meta("b"), 1: meta("b")}),
                      response(grouped), Response("s", 1, (0, 1), {0: meta("s", process_set=1),
                                                                     1: meta("s", process_set=1)}))
    both = [cache.encode([meta("a"), meta("b"), meta("g", group="grp", group_size=1),
                          meta("s", process_set=1)])[0] for cache in caches]
    only_rank_0 = caches[0].encode([meta("c"), meta("a")])[0]
    for cache in caches:
        # a and b: every rank sent them again; g (a group) and s (another process set) go to negotiation
        ready, left = cache.take_common(both, pending=())
        assert [r.name for r in ready] == ["a", "b"]
        assert sorted(m.name for rank in (0, 1) for m in cache.decode(rank, left[rank])) == ["g", "g", "s", "s"]
        # a request another cycle left pending under that key is negotiated as usual
        ready, left = cache.take_common(both, pending={(0, "a")})
        assert [r.name for r in ready] == ["b"] and "a" in {m.name for m in cache.decode(0, left[0])}
        # a bit only one rank set is not common
        assert cache.take_common([only_rank_0, b""], pending=()) == ([], [only_rank_0, b""])
