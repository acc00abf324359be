"""Keys that the launcher and the ranks share in the rendezvous store."""


def peer_failure_key(rank: int) -> str:
    """Where a rank records that its operations failed because of another rank (read by the launcher)."""
    return f"torchring/peer_failure/{rank}"


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
