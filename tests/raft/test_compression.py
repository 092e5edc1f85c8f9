"""Small Raft messages get a small deflate state (`p2pgen.raft.transport.SmallMessageZlib`, docs/design/pysyncobj.md,
"Small messages"): the stream is zlib's own, so pysyncobj's unchanged `zlib.decompress` reads it, and large messages
are compressed exactly as pysyncobj compresses them."""

from __future__ import annotations

import os
import pickle
import zlib

import pytest
from pysyncobj import tcp_connection

from p2pgen.raft.transport import SMALL_MESSAGE, SMALL_WINDOW_BITS, SmallMessageZlib


def test_pysyncobj_connections_compress_through_the_small_message_zlib():
    assert isinstance(tcp_connection.zlib, SmallMessageZlib)


@pytest.mark.parametrize("size", [0, 1, 100, SMALL_MESSAGE - 1, SMALL_MESSAGE, SMALL_MESSAGE + 1, 10 * SMALL_MESSAGE])
@pytest.mark.parametrize("compressible", [True, False])
def test_every_message_decompresses_with_plain_zlib_to_what_was_sent(size, compressible):
    data = (b"append_entries " * (size // 15 + 1))[:size] if compressible else os.urandom(size)
    sent = SmallMessageZlib.compress(data, 3)
    assert zlib.decompress(sent) == data
    if size <= SMALL_MESSAGE:
        assert sent[0] >> 4 == SMALL_WINDOW_BITS - 8        # the stream header names the small window
    else:
        assert sent == zlib.compress(data, 3)               # as pysyncobj compresses it


def test_a_raft_heartbeat_round_trips_as_pysyncobj_reads_it():
    message = {"type": "append_entries", "term": 7, "commit_index": 120, "entries": [], "prevLogIdx": 120,
               "prevLogTerm": 7}
    assert pickle.loads(zlib.decompress(SmallMessageZlib.compress(pickle.dumps(message), 3))) == message
