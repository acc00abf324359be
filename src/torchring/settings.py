"""Every ``TORCHRING_*``/``HOROVOD_*`` setting a rank reads: one table, parsed once into ``Settings``.

``VARIABLES`` names each setting with its type, default and meaning (docs/api.md's settings tables
are checked against it). ``hvd.init()`` parses them all with ``Settings.from_env()`` and passes the
result down to the runtime. The few readers that run outside ``init()`` (``get_logger``, the elastic
``run`` decorator between resets, an elastic ``State``'s checkpoint directory, ``DistributedOptimizer``)
read their one variable with ``read(name)``, through the same parser, so every reader accepts the
same values.

A Horovod setting may be given as ``TORCHRING_<NAME>`` or ``HOROVOD_<NAME>`` (the first wins);
torchring's own settings only as ``TORCHRING_<NAME>``. An empty value counts as unset. A value that
does not parse is a ``ValueError`` naming the variable that was set, e.g.
``TORCHRING_LOG_LEVEL='bogus': use one of TRACE, DEBUG, ...``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import contract

PREFIX = "TORCHRING_"


def _number(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ValueError("must be a number") from None


def _non_negative(raw: str) -> float:
    value = _number(raw)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def _count(raw: str) -> int:
    """A non-negative amount given as a number (``1e6`` is accepted), kept as an int."""
    return int(_non_negative(raw))


def _flag(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be 1 or 0 (or true/false, yes/no, on/off)")


def _text(raw: str) -> str:
    return raw


#: Level names accepted by ``get_logger`` and ``init()`` alike; TRACE is DEBUG, FATAL is CRITICAL.
LOG_LEVELS = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
    "critical": logging.CRITICAL,
}


def _cuda_backend(raw: str) -> str:
    if raw.lower() not in ("nccl", "gloo"):
        raise ValueError("use nccl or gloo")
    return raw.lower()


def _log_level(raw: str) -> int:
    level = LOG_LEVELS.get(raw.strip().lower())
    if level is None:
        raise ValueError("use one of TRACE, DEBUG, INFO, WARNING (or WARN), ERROR, FATAL (or CRITICAL)")
    return level


def _port(raw: str) -> int:
    try:
        port = int(raw)
    except ValueError:
        raise ValueError("must be a port number") from None
    if not 0 < port < 65536:
        raise ValueError("must be a port number (1-65535)")
    return port


def _reset_limit(raw: str) -> int | None:
    try:
        value = int(raw)
    except ValueError:
        raise ValueError("must be an integer") from None
    return value if value >= 0 else None


@dataclass(frozen=True)
class Variable:
    """One setting: its ``TORCHRING_`` name, how its value is parsed, its default and what it does."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    #: Also read under Horovod's name (``HOROVOD_<NAME>``), as Horovod documents it.
    horovod: bool = False

    @property
    def field(self) -> str:
        """The ``Settings`` attribute holding the value: ``fusion_threshold`` for ``TORCHRING_FUSION_THRESHOLD``."""
        return self.name.removeprefix(PREFIX).lower()

    @property
    def names(self) -> tuple[str, ...]:
        """The variables read, in order of precedence."""
        return (self.name, contract.horovod_name(self.name)) if self.horovod else (self.name,)

    def read(self, env: Mapping[str, str] | None = None) -> Any:
        """The parsed value from ``env`` (default ``os.environ``), or the default when unset."""
        env = os.environ if env is None else env
        for name in self.names:
            raw = env.get(name)
            if raw not in (None, ""):
                try:
                    return self.parse(raw)
                except ValueError as error:
                    raise ValueError(f"{name}={raw!r}: {error}") from None
        return self.default


def _horovod(name: str, parse: Callable[[str], Any], default: Any, doc: str) -> Variable:
    return Variable(PREFIX + name, parse, default, doc, horovod=True)


def _own(name: str, parse: Callable[[str], Any], default: Any, doc: str) -> Variable:
    return Variable(name if name.startswith(PREFIX) else PREFIX + name, parse, default, doc)


#: Every setting a rank reads (and the launcher's hang timeout), Horovod's first. ``Settings`` has one
#: attribute per entry, in this order.
VARIABLES: tuple[Variable, ...] = (
    _horovod("FUSION_THRESHOLD", _count, 128 * 1024 * 1024,
             "bytes of ready allreduces fused into one buffer; 0 turns fusion off (rank 0's value applies)"),
    _horovod("CYCLE_TIME", _non_negative, 1.0, "milliseconds between negotiation cycles while requests arrive"),
    _horovod("CACHE_CAPACITY", _count, 1024,
             "negotiated requests remembered; 0 turns the response cache off (rank 0's value applies)"),
    _horovod("TIMELINE", _text, None, "rank 0 writes a Chrome-trace timeline here; DYNAMIC: after start_timeline()"),
    _horovod("TIMELINE_MARK_CYCLES", _flag, False, "mark each negotiation cycle in the timeline"),
    _horovod("STALL_CHECK_DISABLE", _flag, False, "turn the stall inspector off"),
    _horovod("STALL_CHECK_TIME_SECONDS", _number, 60.0, "seconds a request waits for other ranks before a warning"),
    _horovod("STALL_SHUTDOWN_TIME_SECONDS", _number, 0.0, "seconds after which a stall stops the job; 0: never"),
    _horovod("LOG_LEVEL", _log_level, None, "level of the torchring logger and of get_logger()"),
    _horovod("LOG_HIDE_TIME", _flag, False, "leave the date and time out of torchring's log lines"),
    _horovod("DYNAMIC_PROCESS_SETS", _flag, False, "allow add_process_set/remove_process_set"),
    _horovod("GLOO_TIMEOUT_SECONDS", _number, 30.0, "seconds one collective may wait for a peer"),
    _horovod("START_TIMEOUT", _number, 300.0, "seconds rendezvous waits for every rank"),
    _horovod("AUTOTUNE", _flag, False,
             "tune the fusion threshold, the cycle time and the gradient bucket size while training (docs/tuning.md)"),
    _horovod("AUTOTUNE_LOG", _text, None, "rank 0 writes every autotune sample here, in Horovod's CSV layout"),
    _horovod("AUTOTUNE_WARMUP_SAMPLES", _count, 3, "autotune samples discarded at the start"),
    _horovod("AUTOTUNE_STEPS_PER_SAMPLE", _count, 10, "optimizer steps per autotune sample"),
    _horovod("AUTOTUNE_BAYES_OPT_MAX_SAMPLES", _count, 20, "autotune samples before the best values are kept"),
    _horovod("AUTOTUNE_GAUSSIAN_PROCESS_NOISE", _number, 0.8,
             "noise term (alpha) of the autotuner's Gaussian process; higher on noisier machines"),
    _own("BUCKET_CAP_MB", _number, 25.0, "size of DistributedOptimizer's gradient buckets after the first"),
    _own("GRADIENT_LANE", _flag, True, "0 keeps DistributedOptimizer on the engine instead of its bucket lane"),
    _own("NCCL_TIMEOUT_SECONDS", _number, 600.0,
         "seconds one NCCL collective may wait for a peer before it fails with HorovodInternalError (DDP's default)"),
    _own("CUDA_BACKEND", _cuda_backend, "nccl",
         "what moves CUDA tensors: nccl (one GPU per rank), or gloo (several ranks may share a GPU)"),
    _own("DEADLOCK_TIMEOUT", _non_negative, 5.0,
         "seconds every rank must wait for collectives no rank can complete before the job is declared "
         "deadlocked (ranks diverged); 0: never (rank 0's value applies)"),
    _own("IDLE_AFTER_MS", _number, 0.0, "milliseconds engines keep cycling without work before blocking"),
    _own("WAIT_SPIN_US", _non_negative, None,
         "microseconds a blocking wait on tensors of up to 64 KB (synchronize, a blocking collective, a barrier) "
         "polls for its result before it sleeps, while the host has a CPU for each of its ranks; 0: sleep at "
         "once; unset: 1500 where this host wakes a sleeping thread 30 µs late or more (measured at init), "
         "else 0"),
    _own("GC_FREEZE", _flag, True,
         "at init(), gc.freeze() the objects alive then (imports, model, data), so that Python's full garbage "
         "collections stop walking them again (each walk took ~90 ms per process here); 0: leave the collector "
         "alone"),
    _own("GIL_SWITCH_INTERVAL_MS", _number, None,
         "sys.setswitchinterval at init() (unset: the program's own, 5 ms by Python's default)"),
    _own("METRICS_PORT", _port, None, "each rank serves Prometheus metrics on this port + its local rank"),
    _own(contract.METRICS_PUBLISH, _flag, False, "publish metrics to the launcher (set by torchring run)"),
    _own("CHECKPOINT_DIR", _text, None, "elastic commits are also written to this directory"),
    _own(contract.ELASTIC, _flag, False, "this worker belongs to an elastic job (set by torchring run)"),
    _own(contract.RESET_LIMIT, _reset_limit, None, "resets the elastic job allows (set by torchring run)"),
    _own(contract.ELASTIC_TIMEOUT, _number, 600.0,
         "seconds an elastic worker waits for a place in a new generation (set by torchring run)"),
    _own(contract.ELASTIC_SPARE, _flag, False,
         "this elastic worker is a hot spare: it waits in init() until the launcher gives it a place (set by "
         "torchring run --spares)"),
    _own(contract.FLIGHT_RECORD_FILE, _text, None,
         "the flight recorder writes this rank's last collectives and step times here (set by torchring run)"),
    _own("CONTROL_PROBE", _flag, True,
         "settle steady-state cycles with one small AND collective instead of the all-gather; 0: always "
         "all-gather (rank 0's value applies; see docs/scale.md)"),
    _own("CONTROL_EXPRESS", _flag, True,
         "a loop repeating one small cached CPU allreduce runs its steady-state cycles as one collective (the "
         "probe's flags ride with the data); 0: the probe, then the allreduce (rank 0's value applies; see "
         "docs/scale.md)"),
    _own("LAZY_CONNECT", _flag, True,
         "torchring's Gloo groups connect a pair of ranks when it first communicates instead of every pair "
         "at init (torch's TORCH_GLOO_LAZY_INIT, where this torch has it); 0: full mesh at init (see "
         "docs/scale.md)"),
    _own("CONTROL_GATHER_RANKS", _count, 3,
         "from this many ranks on, cycles go through rank 0: new requests (gather, then one reply to every "
         "rank) instead of the all-gather, and the steady-state probe's AND; 0: never (rank 0's value "
         "applies; see docs/scale.md)"),
    _own("HANG_TIMEOUT", _non_negative, 300.0,
         "read by torchring run: seconds without progress before the hang detector ends the job; 0: off "
         "(--hang-timeout wins)"),
)

_BY_NAME = {variable.name: variable for variable in VARIABLES}


def variable(name: str) -> Variable:
    """The table entry of ``name`` (``TORCHRING_`` prefix optional): ``variable("LOG_LEVEL")``."""
    full = name if name.startswith(PREFIX) else PREFIX + name
    try:
        return _BY_NAME[full]
    except KeyError:
        raise KeyError(f"{full} is not a torchring setting (see torchring.settings.VARIABLES)") from None


def read(name: str, env: Mapping[str, str] | None = None) -> Any:
    """One setting's value from ``env`` (default ``os.environ``), for readers outside ``init()``."""
    return variable(name).read(env)


@dataclass(frozen=True)
class Settings:
    """The value of every setting in ``VARIABLES``, parsed once (units as in the variable names)."""

    fusion_threshold: int = 128 * 1024 * 1024
    cycle_time: float = 1.0
    cache_capacity: int = 1024
    timeline: str | None = None
    timeline_mark_cycles: bool = False
    stall_check_disable: bool = False
    stall_check_time_seconds: float = 60.0
    stall_shutdown_time_seconds: float = 0.0
    log_level: int | None = None
    log_hide_time: bool = False
    dynamic_process_sets: bool = False
    gloo_timeout_seconds: float = 30.0
    start_timeout: float = 300.0
    autotune: bool = False
    autotune_log: str | None = None
    autotune_warmup_samples: int = 3
    autotune_steps_per_sample: int = 10
    autotune_bayes_opt_max_samples: int = 20
    autotune_gaussian_process_noise: float = 0.8
    bucket_cap_mb: float = 25.0
    gradient_lane: bool = True
    nccl_timeout_seconds: float = 600.0
    cuda_backend: str = "nccl"
    deadlock_timeout: float = 5.0
    idle_after_ms: float = 0.0
    wait_spin_us: float | None = None
    gc_freeze: bool = True
    gil_switch_interval_ms: float | None = None
    metrics_port: int | None = None
    metrics_publish: bool = False
    checkpoint_dir: str | None = None
    elastic: bool = False
    reset_limit: int | None = None
    elastic_timeout: float = 600.0
    elastic_spare: bool = False
    flight_record: str | None = None
    control_probe: bool = True
    control_express: bool = True
    lazy_connect: bool = True
    control_gather_ranks: int = 3
    hang_timeout: float = 300.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Parse every setting from ``env`` (default ``os.environ``); the first bad value is an error
        naming its variable."""
        env = os.environ if env is None else env
        return cls(**{variable.field: variable.read(env) for variable in VARIABLES})

