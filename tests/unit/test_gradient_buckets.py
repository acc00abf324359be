"""Static gradient buckets: reverse order, large gradients alone, a small first bucket, dtype boundaries."""

import torch

from torchring.runtime.dataplane.buckets import FIRST_BUCKET_BYTES, Bucket, pack_bucket, plan_buckets, unpack_bucket


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


def _bucket_with_grads(*values):
    params = [torch.zeros(2, 2, requires_grad=True), torch.zeros(3, requires_grad=True)]
    for param, value in zip(params, values, strict=True):
        param.grad = torch.full_like(param, value)
    return Bucket(0, params)


def test_after_a_reduction_the_gradients_are_slices_of_the_bucket_buffer():
    bucket = _bucket_with_grads(1.0, 2.0)
    flat = pack_bucket(bucket)
    assert flat.tolist() == [1.0] * 4 + [2.0] * 3
    flat.mul_(10)  # "the reduction", in place
    unpack_bucket(bucket, flat)
    assert [p.grad.data_ptr() for p in bucket.params] == [flat.data_ptr(), flat.data_ptr() + 4 * 4]
    assert bucket.params[0].grad.shape == (2, 2) and bucket.params[1].grad.tolist() == [20.0] * 3


def test_gradients_kept_as_slices_are_not_copied_and_new_ones_are():
    bucket = _bucket_with_grads(1.0, 2.0)
    unpack_bucket(bucket, pack_bucket(bucket))
    for param in bucket.params:  # zero_grad(set_to_none=False), then backward accumulating in place
        param.grad.zero_().add_(5.0)
    assert bucket.grads_are_views() and pack_bucket(bucket).tolist() == [5.0] * 7
    bucket.params[1].grad = torch.full((3,), 7.0)  # zero_grad(set_to_none=True), then a new gradient
    assert not bucket.grads_are_views() and pack_bucket(bucket).tolist() == [5.0] * 4 + [7.0] * 3


def test_a_reduced_copy_is_copied_into_the_gradients_and_extra_elements_follow_them():
    bucket = _bucket_with_grads(1.0, 2.0)
    flat = pack_bucket(bucket, extra=2)
    assert flat.numel() == 9 and flat[:7].tolist() == [1.0] * 4 + [2.0] * 3
    unpack_bucket(bucket, torch.arange(9.0))  # e.g. decompressed from float16: not the buffer
    assert bucket.params[0].grad.flatten().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert bucket.params[1].grad.data_ptr() != flat.data_ptr() + 4 * 4


def test_a_non_contiguous_parameter_keeps_its_own_gradient():
    params = [torch.zeros(3, 2).t().requires_grad_(), torch.zeros(3, requires_grad=True)]
    for param in params:
        param.grad = torch.ones_like(param)
    bucket = Bucket(0, params)
    flat = pack_bucket(bucket)
    unpack_bucket(bucket, flat)
    assert not bucket.grads_are_views() and params[0].grad.tolist() == [[1.0] * 3] * 2
