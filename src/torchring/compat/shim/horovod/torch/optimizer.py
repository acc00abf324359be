"""``horovod.torch.optimizer``: the distributed optimizer."""

from torchring.optimizer import DistributedOptimizer  # noqa: F401
