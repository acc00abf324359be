"""``horovod.torch.compression``."""

from torchring.compression import Compression, Compressor, FP16Compressor, NoneCompressor  # noqa: F401
