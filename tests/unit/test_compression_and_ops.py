"""Compression and reduction op resolution."""

import pytest
import torch

from torchring.compression import Compression
from torchring.reduction import ReduceOp, resolve_op


def test_fp16_compression_round_trip():
    tensor = torch.tensor([1.5, -2.25], dtype=torch.float32)
    compressed, ctx = Compression.fp16.compress(tensor)
    assert compressed.dtype == torch.float16
    assert torch.equal(Compression.fp16.decompress(compressed, ctx), tensor)


def test_fp16_compression_leaves_integers_alone():
    tensor = torch.tensor([1, 2])
    compressed, ctx = Compression.fp16.compress(tensor)
    assert compressed is tensor and Compression.fp16.decompress(compressed, ctx) is tensor


def test_resolve_op():
    assert resolve_op(None, None) is ReduceOp.AVERAGE
    assert resolve_op(None, False) is ReduceOp.SUM
    assert resolve_op(ReduceOp.MAX, None) is ReduceOp.MAX
    with pytest.raises(ValueError):
        resolve_op(ReduceOp.SUM, True)
    with pytest.raises(ValueError, match="Unknown"):
        resolve_op(42, None)

