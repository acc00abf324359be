"""``horovod.torch.elastic.sampler``: the elastic sampler."""

from torchring.elastic.sampler import ElasticSampler  # noqa: F401
