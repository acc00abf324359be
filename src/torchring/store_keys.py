"""Keys that the launcher and the ranks share in the rendezvous store."""


def peer_failure_key(rank: int) -> str:
    """Where a rank records that its operations failed because of another rank (read by the launcher)."""
    return f"torchring/peer_failure/{rank}"


#: Where the elastic launcher publishes the host set's version: ``"<version> <added|removed>"``.
HOSTS_VERSION_KEY = "torchring/elastic/hosts_version"
