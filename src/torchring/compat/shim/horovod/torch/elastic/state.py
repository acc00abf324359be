"""``horovod.torch.elastic.state``: the elastic state classes."""

from torchring.elastic.state import ObjectState, State, TorchState  # noqa: F401
