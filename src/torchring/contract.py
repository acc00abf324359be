"""The names the launcher and the ranks share: the variables ``torchring run`` sets for each rank, and
the keys both sides use in the job's rendezvous store.

The launcher (``torchring.launch``) writes them; the ranks (``torchring.environments``, ``runtime``,
``elastic``, ``metrics``) read them. Both sides import the names from here, so neither can drift from
the other. This module imports nothing, so the launcher can use it without loading the runtime.
"""

# ---- variables the launcher sets for every rank -------------------------------------------------

#: A rank's place under a fixed-size ``torchring run``. The launcher sets each of them under
#: Horovod's name too (``horovod_name``), which programs written for horovodrun read.
RANK = "TORCHRING_RANK"
SIZE = "TORCHRING_SIZE"
LOCAL_RANK = "TORCHRING_LOCAL_RANK"
LOCAL_SIZE = "TORCHRING_LOCAL_SIZE"
CROSS_RANK = "TORCHRING_CROSS_RANK"
CROSS_SIZE = "TORCHRING_CROSS_SIZE"
HOSTNAME = "TORCHRING_HOSTNAME"
TOPOLOGY_VARIABLES = (RANK, SIZE, LOCAL_RANK, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE, HOSTNAME)


def horovod_name(variable: str) -> str:
    """Horovod's name for a ``TORCHRING_`` variable: ``HOROVOD_RANK`` for ``TORCHRING_RANK``."""
    return "HOROVOD_" + variable.removeprefix("TORCHRING_")


#: The rendezvous store every rank connects to (torchrun's ``MASTER_ADDR``/``MASTER_PORT`` are set too).
STORE_ADDR = "TORCHRING_STORE_ADDR"
STORE_PORT = "TORCHRING_STORE_PORT"
#: ``0`` when the launcher does not serve the store, so rank 0 does (default: the launcher serves it).
STORE_SERVED = "TORCHRING_STORE_SERVED"

#: The job's id and secret: every value torchring puts in the store for another process is signed with
#: them (``store_auth``). The launcher makes them per job; a rank takes the secret out of its
#: environment at its first use, so what the rank starts does not inherit it.
JOB_ID = "TORCHRING_JOB_ID"
JOB_SECRET = "TORCHRING_JOB_SECRET"

#: ``1`` for the workers of an elastic ``torchring run``, which learn their rank from the store.
ELASTIC = "TORCHRING_ELASTIC"
#: The elastic worker's name in the launcher's assignments (``elastic_assignment_key``).
WORKER_ID = "TORCHRING_WORKER_ID"
#: Seconds an elastic worker waits for a place in a new generation (``--elastic-timeout``).
ELASTIC_TIMEOUT = "TORCHRING_ELASTIC_TIMEOUT"
#: How many resets the elastic job allows (``--reset-limit``).
RESET_LIMIT = "TORCHRING_RESET_LIMIT"
#: ``1`` for an elastic worker started as a hot spare (``--spares``): it waits in ``hvd.init()``, with no
#: deadline, until the launcher gives it a place.
ELASTIC_SPARE = "TORCHRING_ELASTIC_SPARE"
#: ``1`` when the launcher collects the ranks' metrics from the store (``--metrics-port``).
METRICS_PUBLISH = "TORCHRING_METRICS_PUBLISH"

# ---- keys in the rendezvous store ---------------------------------------------------------------


def peer_failure_key(rank: int) -> str:
    """Where a rank records that its operations failed because of another rank (read by the launcher)."""
    return f"torchring/peer_failure/{rank}"


def own_failure_key(rank: int) -> str:
    """Where a rank records the exception of its own that ends it (``rank_failure``; read by the launcher)."""
    return f"torchring/own_failure/{rank}"


#: Where the ranks' engines record that they found the job deadlocked (``runtime.coordination.deadlock``): JSON with
#: the blamed ranks and the report, read by the launcher.
DEADLOCK_KEY = "torchring/deadlock"

#: Where the elastic launcher publishes the host set's version: ``"<version> <added|removed>"``.
HOSTS_VERSION_KEY = "torchring/elastic/hosts_version"

#: The elastic launcher's current generation (an integer): the membership workers join at init.
ELASTIC_GENERATION_KEY = "torchring/elastic/generation"


def elastic_assignment_key(generation: int, worker_id: str) -> str:
    """A worker's place in ``generation``: ``"rank size local_rank local_size cross_rank cross_size host"``."""
    return f"torchring/elastic/{generation}/assign/{worker_id}"


def elastic_arrived_key(generation: int, rank: int) -> str:
    """Set by rank ``rank`` once it has joined ``generation``."""
    return f"torchring/elastic/{generation}/arrived/{rank}"


def elastic_standby_key(worker_id: str) -> str:
    """Set by a hot spare once it waits in ``hvd.init()`` (torch imported, connected to the store)."""
    return f"torchring/elastic/standby/{worker_id}"


def elastic_first_step_key(generation: int) -> str:
    """Set by rank 0 of ``generation`` when its first training step there completed (an optimizer step
    or a ``commit()``): the launcher times recoveries with it."""
    return f"torchring/elastic/{generation}/first_step"


def metrics_snapshot_key(rank: int) -> str:
    """Where rank ``rank`` publishes its metrics snapshot for the launcher."""
    return f"torchring/metrics/{rank}"


#: The pickled function and arguments of ``torchring.run(fn)``, put by the launcher.
FUNCTION_KEY = "torchring/function/payload"


def function_result_key(rank: int) -> str:
    """Where rank ``rank`` of ``torchring.run(fn)`` puts its pickled result."""
    return f"torchring/function/result/{rank}"


def generation_prefix(generation: int) -> str:
    """The store prefix of one ``init()`` of a fixed-size job (its groups, arrivals and wake-ups)."""
    return f"torchring/{generation}"


def elastic_generation_prefix(generation: int) -> str:
    """The store prefix of one generation of an elastic job."""
    return f"torchring/elastic-{generation}"

# ---- stack sampling (the launcher's hang detector) ------------------------------------------------

#: The file a local rank's Python appends its stacks to when it receives ``STACK_DUMP_SIGNAL``; read by
#: ``torchring.launch.sampling.stack_hook.sitecustomize`` (which registers the handler) and set by the launcher.
STACK_FILE = "TORCHRING_STACK_FILE"
#: The signal the launcher sends a rank for a stack dump (by number: ``signal.SIGUSR2`` is 12 on Linux).
STACK_DUMP_SIGNAL_NAME = "SIGUSR2"
#: The first line a rank writes to its stack file: ``torchring-stacks pid=<pid>`` (the process to signal).
STACK_FILE_HEADER = "torchring-stacks pid="

# ---- the flight recorder (the hang report's "last collectives", straggler detection) ---------------

#: The JSON file a rank's flight recorder (``torchring.runtime.observe.flight_recorder``) rewrites about once a
#: second with its last collectives, its pending requests and its optimizer step times; set by the
#: launcher, read by the rank at ``init()`` (and removed from its environment, so children do not inherit it).
FLIGHT_RECORD_FILE = "TORCHRING_FLIGHT_RECORD"
