"""Batch normalization with statistics synchronized across ranks (Horovod's ``SyncBatchNorm``).

In training mode, and when the job has more than one rank, the mean and variance of each channel are
those of the batches of every rank together (ranks may have batches of different sizes). The
backward pass gives every rank the gradient of the sum of all ranks' losses with respect to its own
input; the weight and bias gradients are this rank's share, which sum over ranks to the gradient of
that total loss (``DistributedOptimizer`` then averages them, as it does for every other parameter).

Each training step runs one allreduce in forward and, when the input needs a gradient, one in
backward. Every rank must therefore run forward and backward through each ``SyncBatchNorm`` layer
the same number of times and in the same order.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from .basics import size
from .collectives import allreduce
from .reduction import Sum

_STATS_DTYPE = torch.float64


def _compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype arithmetic is done in: at least float32, so half inputs do not lose precision."""
    return torch.promote_types(tensor.dtype, torch.float32)


def _channel_view(values: torch.Tensor, dims: int) -> torch.Tensor:
    """Per-channel ``values`` shaped (1, C, 1, ...) to broadcast against an input of ``dims`` dimensions."""
    return values.reshape((1, -1) + (1,) * (dims - 2))


class _SyncBatchNormFunction(torch.autograd.Function):
    """Normalize with statistics over every rank's batch; backward reduces the two sums it needs."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                running_mean: torch.Tensor | None, running_var: torch.Tensor | None, eps: float,
                momentum: float) -> torch.Tensor:
        dtype = _compute_dtype(input)
        channels = input.shape[1]
        reduce_dims = [d for d in range(input.dim()) if d != 1]
        count = input.numel() // channels if channels else 0
        x = input.detach().to(dtype)
        if count > 0:
            local_var, local_mean = torch.var_mean(x, dim=reduce_dims, correction=0)
        else:
            local_var = local_mean = x.new_zeros(channels)

        local_mean, local_var = local_mean.to(_STATS_DTYPE), local_var.to(_STATS_DTYPE)
        stats = torch.cat([
            torch.full((1,), float(count), dtype=_STATS_DTYPE, device=input.device),
            local_mean * count,
            (local_var + local_mean * local_mean) * count,
        ])
        stats = allreduce(stats, op=Sum)
        total = float(stats[0].item())
        mean = stats[1:channels + 1] / total
        var = (stats[channels + 1:] / total - mean * mean).clamp_(min=0)
        invstd = torch.rsqrt(var + eps)

        if running_mean is not None and running_var is not None:
            unbiased = var * (total / (total - 1)) if total > 1 else var
            running_mean.lerp_(mean.to(running_mean.dtype), momentum)
            running_var.lerp_(unbiased.to(running_var.dtype), momentum)

        mean, invstd = mean.to(dtype), invstd.to(dtype)
        scale = invstd if weight is None else invstd * weight.detach().to(dtype)
        output = (x - _channel_view(mean, x.dim())) * _channel_view(scale, x.dim())
        if bias is not None:
            output = output + _channel_view(bias.detach().to(dtype), x.dim())

        ctx.save_for_backward(input, weight, mean, invstd)
        ctx.total = total
        ctx.bias_dtype = None if bias is None else bias.dtype
        return output.to(input.dtype)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        input, weight, mean, invstd = ctx.saved_tensors
        dtype, dims = mean.dtype, input.dim()
        reduce_dims = [d for d in range(dims) if d != 1]
        grad = grad_output.to(dtype)
        centered = input.to(dtype) - _channel_view(mean, dims)
        sum_grad = grad.sum(dim=reduce_dims)
        sum_grad_centered = (grad * centered).sum(dim=reduce_dims)

        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            sums = torch.cat([sum_grad, sum_grad_centered]).to(_STATS_DTYPE)
            sums = allreduce(sums, op=Sum).to(dtype)
            channels = mean.numel()
            mean_grad = sums[:channels] / ctx.total
            mean_grad_centered = sums[channels:] / ctx.total
            scale = invstd if weight is None else invstd * weight.to(dtype)
            grad_input = (grad - _channel_view(mean_grad, dims)
                          - centered * _channel_view(invstd * invstd * mean_grad_centered, dims))
            grad_input = (grad_input * _channel_view(scale, dims)).to(input.dtype)
        if ctx.needs_input_grad[1]:
            grad_weight = (sum_grad_centered * invstd).to(weight.dtype)
        if ctx.needs_input_grad[2]:
            grad_bias = sum_grad.to(ctx.bias_dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization over the batches of all ranks, for inputs of shape (N, C) or (N, C, *).

    A drop-in replacement for ``torch.nn.BatchNorm1d/2d/3d`` (same arguments, parameters and
    buffers). In training mode with more than one rank, the statistics are computed over the
    batches of every rank together, and the running statistics are updated with them (the running
    variance with the unbiased variance over the total count). In eval mode, or in a job of one rank,
    it behaves exactly like ``torch.nn.BatchNorm``.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def _update_factor(self) -> float:
        """Count this training batch and return the weight of its statistics in the running ones."""
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalize ``input`` with statistics over every rank's batch (training) or running statistics (eval)."""
        self._check_input_dim(input)
        if not self.training or size() == 1:
            return super().forward(input)
        tracking = self.track_running_stats and self.running_mean is not None
        factor = self._update_factor() if tracking else 0.0
        return _SyncBatchNormFunction.apply(
            input, self.weight, self.bias,
            self.running_mean if tracking else None, self.running_var if tracking else None,
            self.eps, factor,
        )


__all__ = ["SyncBatchNorm"]
