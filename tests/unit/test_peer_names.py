"""The job's host table and the naming of a lost peer's address in a collective's error."""

import torch.distributed as dist

from torchring.runtime.peer_names import decode_host_table, encode_host_table, host_table_key, name_addresses
from torchring.store_auth import AuthenticatedStore, JobCredentials

GLOO_ERROR = ("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:56498: Connection reset by peer. This is "
              "typically caused by a remote worker hanging")


def _store() -> AuthenticatedStore:
    return AuthenticatedStore(dist.HashStore(), JobCredentials.new())


def test_the_table_keeps_each_host_once_and_every_rank_in_order():
    text = encode_host_table(["a", "a", "b", "a", "c"])
    assert text.count('"a"') == 1
    assert decode_host_table(text) == {"a": [0, 1, 3], "b": [2], "c": [4]}


def test_an_address_in_an_error_is_named_with_its_host_and_ranks():
    store = _store()
    store.set(host_table_key("g1"), encode_host_table(["localhost", "nowhere.invalid", "localhost"]))
    assert name_addresses(GLOO_ERROR, store, "g1") == "127.0.0.1 is localhost (ranks 0, 2)"
    assert name_addresses(GLOO_ERROR.replace("127.0.0.1", "192.0.2.77"), store, "g1") == ""  # not a job host
    assert name_addresses("Connection reset by peer", store, "g1") == ""  # no address at all
    store.set(host_table_key("g2"), encode_host_table(["127.0.0.1", "127.0.0.1"]))  # hosts known by address (Ray)
    assert name_addresses(GLOO_ERROR, store, "g2") == "127.0.0.1 holds ranks 0, 1"


def test_without_a_table_or_with_a_forged_one_nothing_is_added():
    store = _store()
    assert name_addresses(GLOO_ERROR, store, "g1") == ""
    store.raw.set(host_table_key("g1"), encode_host_table(["localhost"]))  # not signed with the job's secret
    assert name_addresses(GLOO_ERROR, store, "g1") == ""

