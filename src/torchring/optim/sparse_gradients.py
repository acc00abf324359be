"""What ``DistributedOptimizer`` remembers about sparse gradients (``nn.Embedding(sparse=True)``).

A gradient seen sparse once is given sparse zeros on a rank that did not compute it (so every rank
submits the same requests); with ``sparse_as_dense=True`` it is reduced dense and made sparse again
afterwards, so that an optimizer that needs sparse gradients (``SparseAdam``) can step.
"""

from __future__ import annotations

import torch

__all__ = ["SparseGradients"]


class SparseGradients:
    """The sparse dimensions of the gradients seen sparse, and the ones densified for this step."""

    def __init__(self, as_dense: bool) -> None:
        self.as_dense = as_dense
        #: Gradients reduced sparse (allgathered): their sparse dimension.
        self._reduced_sparse: dict[torch.Tensor, int] = {}
        #: With ``sparse_as_dense``: gradients seen sparse, made sparse again after their dense reduction.
        self._densified: dict[torch.Tensor, int] = {}

    @property
    def any_reduced_sparse(self) -> bool:
        """Whether some gradient was reduced as a sparse tensor (then no lane can carry the buckets)."""
        return bool(self._reduced_sparse)

    def note_reduced_sparse(self, param: torch.Tensor, sparse_dim: int) -> None:
        self._reduced_sparse[param] = sparse_dim

    def zero_gradient(self, param: torch.Tensor) -> torch.Tensor:
        """Zeros for a gradient this rank did not compute, sparse if the gradient was reduced sparse before.

        A sparse contribution keeps this rank's request names in line with ranks whose gradient is
        sparse; only parameters seen with a sparse gradient in an earlier step can be recognised.
        """
        sparse_dim = self._reduced_sparse.get(param)
        if sparse_dim is None or self.as_dense:
            return torch.zeros_like(param)
        indices = torch.empty((sparse_dim, 0), dtype=torch.int64, device=param.device)
        values = param.new_empty((0, *param.shape[sparse_dim:]))
        return torch.sparse_coo_tensor(indices, values, param.shape, check_invariants=True)

    def prepare(self, param: torch.Tensor) -> None:
        """Before a reduction: zeros where this rank has no gradient; the dense form with ``sparse_as_dense``."""
        if param.grad is None:
            param.grad = self.zero_gradient(param)
        elif param.grad.is_sparse and self.as_dense:
            self._densified[param] = param.grad.sparse_dim()
            param.grad = param.grad.to_dense()

    def restore(self) -> None:
        """After the reductions: the densified gradients sparse again (the rows that are not zero)."""
        for param, sparse_dim in self._densified.items():
            if param.grad is not None and not param.grad.is_sparse:
                param.grad = param.grad.to_sparse(sparse_dim).coalesce()
