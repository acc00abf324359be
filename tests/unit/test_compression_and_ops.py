"""Compression, reduction op resolution and settings."""

import pytest
import torch

from torchring.compression import Compression
from torchring.config import bool_setting, float_setting, setting
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


def test_settings_prefer_torchring_names():
    env = {"TORCHRING_CYCLE_TIME": "2.5", "HOROVOD_CYCLE_TIME": "9", "HOROVOD_STALL_CHECK_DISABLE": "1"}
    assert setting("CYCLE_TIME", env) == "2.5"
    assert float_setting("CYCLE_TIME", 1.0, env) == 2.5
    assert bool_setting("STALL_CHECK_DISABLE", False, env) is True
    assert float_setting("FUSION_THRESHOLD", 7.0, env) == 7.0
    with pytest.raises(ValueError, match="HOROVOD_CYCLE_TIME"):
        float_setting("CYCLE_TIME", 1.0, {"HOROVOD_CYCLE_TIME": "fast"})
