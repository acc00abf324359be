"""Elastic training (Horovod's ``hvd.elastic``): states that commit and roll back, a decorator that
keeps training through membership changes, and a sampler that re-shards unprocessed samples.

    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    train(state)
"""

from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt
from .reset_loop import ResetLimitExceeded, run
from .sampler import ElasticSampler
from .state import ObjectState, State, TorchState

__all__ = [
    "ElasticSampler",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "ObjectState",
    "ResetLimitExceeded",
    "State",
    "TorchState",
    "run",
]
