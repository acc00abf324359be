"""Static gradient buckets: reverse order, large gradients alone, a small first bucket, dtype boundaries."""

import torch

from torchring.runtime.gradient_buckets import FIRST_BUCKET_BYTES, plan_buckets


def shapes(buckets):
    return [[tuple(p.shape) for p in bucket.params] for bucket in buckets]


def test_large_gradients_get_their_own_bucket_and_order_is_reversed():
    params = [torch.zeros(1024, 784), torch.zeros(1024), torch.zeros(1024, 1024), torch.zeros(1024),
              torch.zeros(10, 1024), torch.zeros(10)]
    buckets = plan_buckets(params, cap_bytes=25 << 20)
    assert shapes(buckets) == [[(10,), (10, 1024), (1024,)], [(1024, 1024)], [(1024,)], [(1024, 784)]]
    assert [b.index for b in buckets] == [0, 1, 2, 3]


def test_first_bucket_is_small_then_the_cap_applies():
    per_tensor = FIRST_BUCKET_BYTES // 4  # a quarter of the first bucket each
    params = [torch.zeros(per_tensor // 4) for _ in range(12)]
    buckets = plan_buckets(params, cap_bytes=FIRST_BUCKET_BYTES * 2)
    assert [len(b.params) for b in buckets] == [4, 8]


def test_dtypes_never_share_a_bucket_and_the_flat_buffer_is_reused():
    params = [torch.zeros(4, dtype=torch.float64), torch.zeros(4), torch.zeros(4)]
    buckets = plan_buckets(params, cap_bytes=1 << 20)
    assert shapes(buckets) == [[(4,), (4,)], [(4,)]]
    flat = buckets[0].flat_buffer()
    assert flat.numel() == 8 and flat.dtype == torch.float32 and buckets[0].flat_buffer() is flat
