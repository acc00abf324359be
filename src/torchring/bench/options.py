"""What the launcher asks the ranks to measure, passed to them as one JSON argument."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any

#: The frameworks ``torchring bench train`` can compare.
FRAMEWORKS = ("torchring", "ddp", "horovod")
#: The models ``torchring bench train`` can train (``models.MODELS``; named here, where loading torch is
#: not needed, for the command line).
MODEL_NAMES = ("mlp", "convnet", "resnet", "deep")
#: ``torchring bench control-plane``: the simulated job sizes by default,
DEFAULT_VIRTUAL_RANKS = (8, 64, 512, 4096)
#: the requests per steady-state cycle (a mid-sized model's gradient buckets and metric allreduces)
DEFAULT_REQUESTS = 32
#: and the new requests per new-request cycle.
DEFAULT_NEW_REQUESTS = 4


@dataclass(frozen=True)
class CollectivesOptions:
    """``torchring bench collectives``: which operations and sizes, and how many iterations."""

    ops: tuple[str, ...]
    sizes: tuple[int, ...]
    #: Timed iterations per size and operation; None: fewer for larger sizes (see ``collectives.schedule``).
    iters: int | None = None
    #: Untimed iterations first; None: chosen with ``iters``.
    warmup: int | None = None


@dataclass(frozen=True)
class TrainOptions:
    """``torchring bench train``: the model, the batches, and the frameworks compared."""

    model: str = "mlp"
    batch_size: int = 64
    warmup_batches: int = 5
    batches_per_round: int = 30
    rounds: int = 10
    frameworks: tuple[str, ...] = ("torchring", "ddp", "horovod")
    threads: int = 1
    seed: int = 42


@dataclass(frozen=True)
class SmallOpsOptions:
    """One job of ``torchring bench scaling --small-ops``: which framework (``torchring``, ``c10d`` or
    ``horovod``) and how many timed samples of each measurement."""

    framework: str = "torchring"
    latency_rounds: int = 50
    burst_rounds: int = 10
    warmup: int = 20


Options = CollectivesOptions | TrainOptions | SmallOpsOptions


def encode(options: Options, result_path: str) -> str:
    """The worker's JSON argument: the options and the file rank 0 writes its results to."""
    return json.dumps({"options": asdict(options), "result_path": result_path})


def decode(mode: str, text: str) -> tuple[Options, str]:
    """The options and result path of ``encode``'s output for ``mode`` (``collectives``, ``train`` or ``small-ops``)."""
    payload = json.loads(text)
    cls = {"collectives": CollectivesOptions, "train": TrainOptions, "small-ops": SmallOpsOptions}.get(mode)
    if cls is None:
        raise ValueError(f"unknown benchmark mode {mode!r}")
    values: dict[str, Any] = payload["options"]
    names = {field.name for field in fields(cls)}
    kwargs = {key: tuple(value) if isinstance(value, list) else value for key, value in values.items() if key in names}
    return cls(**kwargs), payload["result_path"]
