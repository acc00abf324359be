"""What a failing rank records for the launcher: its own exception, or a consequence of a peer's."""

import json

from torchring.exceptions import HorovodInternalError
from torchring.launch.rendezvous import parse_deadlock
from torchring.rank_failure import caused_by_peer, parse_own_failure


def test_errors_of_a_vanished_peer_are_consequences_and_ordinary_errors_are_causes():
    assert caused_by_peer(HorovodInternalError("gradient allreduce failed"))
    assert caused_by_peer(RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by "
                                       "peer [127.0.0.1]:27423"))
    try:
        try:
            raise RuntimeError("Connection reset by peer")
        except RuntimeError as inner:
            raise ValueError("could not reduce the loss") from inner
    except ValueError as outer:
        assert caused_by_peer(outer)  # raised from a peer's loss
    assert not caused_by_peer(ValueError("bad batch at step 20"))
    assert not caused_by_peer(KeyError("label"))
    assert not caused_by_peer(RuntimeError("mat1 and mat2 shapes cannot be multiplied (16x32 and 31x64)"))
    assert not caused_by_peer(RuntimeError("DataLoader timed out after 30 seconds"))
    assert not caused_by_peer(ConnectionResetError("Connection reset by peer"))  # the script's own download
    assert caused_by_peer(RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
                                       "waiting 30000ms for recv operation to complete"))


def test_an_own_failure_record_is_read_only_when_well_formed():
    record = parse_own_failure(json.dumps({"at": 12.5, "error": "ValueError: bad", "where": "train.py:3"}).encode())
    assert record is not None and record.describe() == "raised ValueError: bad (train.py:3)" and record.at == 12.5
    for bad in (b"not json", b"[]", b'{"at": "now", "error": "x"}', b'{"at": true, "error": "x"}', b'{"at": 1}',
                b"\xff\xfe"):
        assert parse_own_failure(bad) is None
    shown = parse_own_failure(json.dumps({"at": 1, "error": "E: a\x1b[31mred\n" + "x" * 1000}).encode())
    assert "\x1b" not in shown.error and "\n" not in shown.error and len(shown.error) <= 400


def test_a_deadlock_record_is_read_only_when_well_formed():
    record = parse_deadlock(json.dumps({"blamed": [1], "lines": ["rank 0: waiting", 7, "last"]}).encode())
    assert record is not None and record.blamed == (1,) and record.lines == ("rank 0: waiting", "last")
    for bad in (b"{}", b'{"blamed": [], "lines": []}', b'{"blamed": [true], "lines": []}', b'{"blamed": "1"}',
                b"nope"):
        assert parse_deadlock(bad) is None
