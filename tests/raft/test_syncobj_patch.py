"""The corrections in `p2pgen.raft.syncobj` against the pinned pysyncobj, message by message.

A follower (or leader) SyncObj is built but never ticked (no socket is bound); the test delivers Raft messages to
its message handler directly, as the transport would, and reads its log. Each scenario runs on plain pysyncobj
first, to show the wrong behaviour is real, then on `JobSyncObj`.
"""

from __future__ import annotations

import logging

import pytest
from pysyncobj import SyncObj
from pysyncobj.syncobj import _COMMAND_TYPE, _RAFT_STATE

from p2pgen.raft.identity import NodeId
from p2pgen.raft.node import RaftTiming
from p2pgen.raft.syncobj import JobSyncObj
from p2pgen.raft.transport import NodeTransport
from p2pgen_lab.rigs.agents import free_control_ports

pytestmark = pytest.mark.timeout(30)

NOOP = bytes([_COMMAND_TYPE.NO_OP])
FOLLOWER, LEADER, OTHER = (f"127.0.0.1:{p + 1}/{n}" for p, n in zip(free_control_ports(3), ("f0", "1e", "07")))
MADE = []


@pytest.fixture(autouse=True)
def destroy_made():
    yield
    while MADE:
        MADE.pop()._doDestroy()          # unbinds the server socket


def make(cls, self_id=FOLLOWER, others=(LEADER, OTHER)):
    conf = RaftTiming().conf(self_id.split("/")[0], "password-for-a-test")
    kwargs = {"on_applied": lambda *a: None} if cls is JobSyncObj else {}
    so = cls(self_id, list(others), conf=conf, consumers=[], nodeClass=NodeId, transportClass=NodeTransport, **kwargs)
    MADE.append(so)
    sent = []
    so._SyncObj__transport.send = lambda node, message: sent.append((node.id, message)) or True
    return so, sent


def deliver(so, message, sender=LEADER):
    so._SyncObj__onMessageReceived(NodeId(sender), message)


def append(term, prev, entries, commit):
    """An append_entries from the leader: entries are (index, term) pairs of no-op entries."""
    return {"type": "append_entries", "term": term, "commit_index": commit, "prevLogIdx": prev[0],
            "prevLogTerm": prev[1], "entries": [(NOOP, i, t) for i, t in entries]}


def log_of(so):
    return [(e[1], e[2]) for e in so._SyncObj__getEntries(1)]


def apply(so):
    so._SyncObj__applyLogEntries()


def caught_up_follower(cls):
    """A follower that holds and applied entries 2..11 of term 1 (the leader's first 10 entries)."""
    so, sent = make(cls)
    deliver(so, append(1, (1, 0), [(i, 1) for i in range(2, 12)], commit=11))
    apply(so)
    assert so.raftLastApplied == 11 and log_of(so)[-1] == (11, 1)
    return so, sent


@pytest.mark.parametrize("cls", [SyncObj, JobSyncObj])
def test_a_batch_sent_again_truncates_applied_entries_only_in_plain_pysyncobj(cls, caplog):
    so, sent = caught_up_follower(cls)
    with caplog.at_level(logging.CRITICAL, logger="pysyncobj"):
        deliver(so, append(1, (5, 1), [(6, 1), (7, 1), (8, 1)], commit=11))    # an early batch, sent again
    truncated = "truncating already-applied log entries" in caplog.text
    if cls is SyncObj:
        assert truncated and log_of(so)[-1] == (8, 1)          # entries 9..11 were applied, and are gone
    else:
        assert not truncated and log_of(so)[-1] == (11, 1)      # Raft: nothing conflicts, nothing is deleted
        assert so._SyncObj__raftCommitIndex == 11
        assert sent[-1][1] == {"type": "next_node_idx", "next_node_idx": 9, "reset": False, "success": True}


@pytest.mark.parametrize("cls", [SyncObj, JobSyncObj])
def test_a_partly_new_batch_keeps_the_held_prefix(cls, caplog):
    so, _ = caught_up_follower(cls)
    with caplog.at_level(logging.CRITICAL, logger="pysyncobj"):
        deliver(so, append(1, (9, 1), [(10, 1), (11, 1), (12, 1), (13, 1)], commit=13))
    assert ("truncating already-applied" in caplog.text) == (cls is SyncObj)
    assert log_of(so)[-1] == (13, 1) and len(log_of(so)) == 13


def test_a_real_conflict_is_still_truncated_from_the_first_conflicting_entry():
    so, sent = make(JobSyncObj)
    deliver(so, append(1, (1, 0), [(i, 1) for i in range(2, 12)], commit=5))   # 6..11 never committed
    apply(so)
    deliver(so, append(2, (5, 1), [(6, 2), (7, 2)], commit=7))                 # a new leader's entries
    assert log_of(so)[5:] == [(6, 2), (7, 2)]
    assert sent[-1][1]["success"] and sent[-1][1]["next_node_idx"] == 8


def test_a_mismatch_at_prev_is_refused_so_the_leader_backs_off():
    so, sent = make(JobSyncObj)
    deliver(so, append(1, (4, 1), [(5, 1)], commit=5))                          # it holds nothing at 4
    assert log_of(so) == [(1, 0)]
    assert sent[-1][1]["success"] is False and sent[-1][1]["reset"] is True


@pytest.mark.parametrize("cls", [SyncObj, JobSyncObj])
def test_a_late_success_ack_moves_next_index_back_only_in_plain_pysyncobj(cls):
    so, _ = make(cls, self_id=LEADER, others=(FOLLOWER, OTHER))
    follower = NodeId(FOLLOWER)
    so._SyncObj__raftState = _RAFT_STATE.LEADER
    so._SyncObj__raftNextIndex[follower] = 40          # batches up to 39 already sent
    so._SyncObj__raftMatchIndex[follower] = 0
    deliver(so, {"type": "next_node_idx", "next_node_idx": 20, "reset": False, "success": True}, sender=FOLLOWER)
    assert so._SyncObj__raftMatchIndex[follower] == 19
    assert so._SyncObj__raftNextIndex[follower] == (20 if cls is SyncObj else 40)
    deliver(so, {"type": "next_node_idx", "next_node_idx": 12, "reset": True, "success": False}, sender=FOLLOWER)
    assert so._SyncObj__raftNextIndex[follower] == 12  # a refusal still backs off


def removal(node_id):
    return ["rem", node_id, NodeId(node_id)]


@pytest.mark.parametrize("cls", [SyncObj, JobSyncObj])
def test_a_leader_appends_one_membership_change_at_a_time_only_in_job_syncobj(cls):
    """pysyncobj 0.3.17 never sets the index its one-change-at-a-time check reads: a leader accepts a second
    removal while the first is uncommitted, and with both applied on append it can end up deciding alone."""
    third = FOLLOWER.replace("/f0", "/3d")
    so, _ = make(cls, self_id=LEADER, others=(FOLLOWER, OTHER, third))
    so._SyncObj__raftState = _RAFT_STATE.LEADER
    so._SyncObj__raftCurrentTerm = 2
    so._SyncObj__raftLog.add(NOOP, 2, 2)                  # the new leader's no-op, committed and applied
    so._SyncObj__noopIDx = 2
    so._SyncObj__raftCommitIndex = 2
    apply(so)
    assert so._SyncObj__changeCluster(removal(OTHER))
    so._SyncObj__raftLog.add(b"\x02", 3, 2)                # appended where the leader's queue puts it
    second = so._SyncObj__changeCluster(removal(third))
    voters = {n.id for n in so.otherNodes} | {LEADER}
    if cls is SyncObj:
        assert second and voters == {LEADER, FOLLOWER}      # two uncommitted changes: 4 voters became 2
        return
    assert not second and voters == {LEADER, FOLLOWER, third}
    so._SyncObj__raftCommitIndex = 3                        # the first change committed and applied
    so._SyncObj__raftLastApplied = 3
    assert so._SyncObj__changeCluster(removal(third))       # now the next one is accepted
    assert {n.id for n in so.otherNodes} | {LEADER} == {LEADER, FOLLOWER}


def test_a_turn_whose_tick_handled_messages_is_followed_by_another_without_sleeping():
    """pysyncobj's tick ends in a poll that handles the messages already waiting, but acts on them only at the
    next tick (here: a follower applies a newer commit index). The node's thread must then turn again at once,
    not sleep until its next timer (up to the append period)."""
    from p2pgen.raft.node import RaftNode

    so, _ = make(JobSyncObj)
    node = RaftNode("job", FOLLOWER, [FOLLOWER, LEADER, OTHER], b"a secret for a test")
    node._so = so
    so.doTick = lambda time_to_wait: None                                 # a tick that handled no message
    assert node._turn() > 0
    so.doTick = lambda time_to_wait: deliver(so, append(1, (1, 0), [(2, 1)], commit=2))   # its last poll did
    assert node._turn() == 0.0
    assert so.raftLastApplied < 2                     # what the append called for waits for the next tick
    so.doTick = lambda time_to_wait: apply(so)
    assert node._turn() > 0 and so.raftLastApplied == 2


def test_only_a_message_that_calls_for_a_tick_is_counted():
    """An idle leader's heartbeat to a follower that holds and applied everything calls for no tick (its handler
    did all of it), so the node's thread may sleep on; a new commit index, new entries, a new term or a forwarded
    command each call for one."""
    so, sent = caught_up_follower(JobSyncObj)
    so._SyncObj__onReadyCalled = True
    counted = so.messages_handled
    deliver(so, append(1, (11, 1), [], commit=11))            # an idle heartbeat: answered, nothing else to do
    assert so.messages_handled == counted and sent[-1][1]["type"] == "next_node_idx"
    deliver(so, append(1, (11, 1), [(12, 1)], commit=11))     # a new entry
    assert so.messages_handled == counted + 1
    deliver(so, append(1, (12, 1), [], commit=12))            # its commit: to apply at the next tick
    assert so.messages_handled == counted + 2
    apply(so)
    deliver(so, append(1, (12, 1), [], commit=12))            # settled again: a heartbeat
    assert so.messages_handled == counted + 2
    deliver(so, append(2, (12, 1), [], commit=12))            # a new term
    assert so.messages_handled == counted + 3
    deliver(so, {"type": "apply_command", "command": NOOP, "request_id": 1}, sender=OTHER)
    assert so.messages_handled == counted + 4                 # never routine: the leader appends it at its tick


class _Member:
    """A non-voting member's connection as the leader's SyncObj sees it."""

    id = "readonly"

    def _destroy(self) -> None:
        pass


def test_an_idle_non_voting_member_gets_every_other_heartbeat_and_anything_new_at_once(monkeypatch):
    import p2pgen.raft.syncobj as job_syncobj

    clock = [1000.0]
    monkeypatch.setattr(job_syncobj, "monotonic_time", lambda: clock[0])
    so, sent = make(JobSyncObj, self_id=LEADER, others=(FOLLOWER, OTHER))
    so._SyncObj__raftState = _RAFT_STATE.LEADER
    so._SyncObj__raftCurrentTerm = 2
    so._SyncObj__raftLog.add(NOOP, 2, 2)
    so._SyncObj__raftCommitIndex = 2
    apply(so)
    for voter in so.otherNodes:
        so._SyncObj__connectedNodes.add(voter)
        so._SyncObj__raftNextIndex[voter] = 3
    so._SyncObj__onReadonlyNodeConnected(_Member())
    period = RaftTiming().append_period

    def heartbeat_after(seconds: float) -> list[str]:
        clock[0] += seconds
        sent.clear()
        so._SyncObj__sendAppendEntries()
        return sorted(node for node, message in sent if message["type"] == "append_entries")

    assert heartbeat_after(0.0) == sorted([FOLLOWER, OTHER, "readonly"])    # a member never sent to
    assert heartbeat_after(period) == sorted([FOLLOWER, OTHER])             # idle: every other period
    assert heartbeat_after(period) == sorted([FOLLOWER, OTHER, "readonly"])
    so._SyncObj__raftLog.add(NOOP, 3, 2)                                     # a new entry: sent at once
    assert heartbeat_after(0.01) == sorted([FOLLOWER, OTHER, "readonly"])
    so._SyncObj__raftCommitIndex = 3                                         # its commit: sent at once
    so._SyncObj__raftNextIndex.update({node: 4 for node in so._SyncObj__raftNextIndex})
    assert heartbeat_after(0.01) == sorted([FOLLOWER, OTHER, "readonly"])
    assert heartbeat_after(0.01) == sorted([FOLLOWER, OTHER])


def _follower_of(self_id: str, others: tuple[str, str]):
    """A RaftNode over a SyncObj that follows LEADER in term 1, its election a full timeout away."""
    from pysyncobj.monotonic import monotonic as so_monotonic

    from p2pgen.raft.node import RaftNode

    so, _ = make(JobSyncObj, self_id=self_id, others=others)
    node = RaftNode("job", self_id, [self_id, *others], b"a secret for a test")
    node._so = so
    so.doTick = lambda time_to_wait: None
    deliver(so, append(1, (1, 0), [(2, 1)], commit=1))            # LEADER leads term 1
    assert so._getLeader().id == LEADER
    so._SyncObj__raftElectionDeadline = so_monotonic() + 10.0
    return node, so


def test_followers_told_their_leader_is_dead_campaign_in_id_order_and_only_for_that_leader():
    """The first surviving voter in id order campaigns at once, the next one `hasten_spread` later: they
    do not split the vote. A leader that is not the one followed changes nothing."""
    from pysyncobj.monotonic import monotonic as so_monotonic

    first, second = sorted((FOLLOWER, OTHER))
    deadlines = {}
    for me, other in ((FOLLOWER, OTHER), (OTHER, FOLLOWER)):
        node, so = _follower_of(me, (LEADER, other))
        node.hasten_election(other)                                  # not the leader it follows
        node._turn()
        assert so._SyncObj__raftElectionDeadline > so_monotonic() + 5.0
        node.hasten_election(LEADER)
        node._turn()
        deadlines[me] = so._SyncObj__raftElectionDeadline - so_monotonic()
    spread = RaftTiming().hasten_spread
    assert deadlines[first] <= 0.01
    assert spread - 0.02 <= deadlines[second] <= spread
