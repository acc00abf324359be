"""``horovod.common.elastic``: the framework-independent elastic state classes."""

from torchring.elastic.state import ObjectState, State  # noqa: F401
