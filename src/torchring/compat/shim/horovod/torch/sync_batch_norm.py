"""``horovod.torch.sync_batch_norm``: batch normalisation synchronised across ranks."""

from torchring.sync_batch_norm import SyncBatchNorm  # noqa: F401
