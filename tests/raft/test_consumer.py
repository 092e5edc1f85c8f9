"""The replicated consumer: a request resent after a timeout and appended twice is applied once; a new request
repeating a committed registration is a replay, not a second registration (the trace checker's `register_once`)."""

from __future__ import annotations

from p2pgen.core import LogPosition, Register
from p2pgen.raft.consumer import JobState


def test_a_resent_request_is_answered_from_its_first_application_and_marked_a_duplicate():
    state = JobState("job")
    state._log_position = lambda: LogPosition(1, 1)        # no SyncObj here: the position of the entry
    register = Register("p1", 8, (("agent", "127.0.0.1:20000"),), at=1.0)
    first = state.submit("req-1", register, _doApply=True)
    assert first.ok and not state.last_was_duplicate
    again = state.submit("req-1", register, _doApply=True)     # the same request, a second log entry
    assert again is first and state.last_was_duplicate          # the node traces nothing for it
    other = state.submit("req-2", Register("p1", 8, (("agent", "127.0.0.1:20000"),), at=2.0), _doApply=True)
    assert other.ok and other.replayed and not state.last_was_duplicate and "replay" in other.reason
    assert [m.identity for m in state.machine.members] == [("p1", 8)]
