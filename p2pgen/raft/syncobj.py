"""`JobSyncObj`: pysyncobj 0.3.17's SyncObj with Raft's log rules restored and every applied entry observed.

Owns seven narrow corrections of the pinned pysyncobj (docs/design/pysyncobj.md: pitfall 17 and its list of
corrections) and one hook:

1. Follower: `SyncObj.__onMessageReceived`, branch `append_entries` with `prevLogIdx`, deletes every entry after
   `prevLogIdx` whenever its log is longer (`if len(prevEntries) > 1: ... self.__deleteEntriesFrom(prevLogIdx
   + 1)`), without comparing terms, and then bounds its commit index by its (now shorter) log. A batch sent again
   (see 2) so truncates entries that were already applied (`CRITICAL truncating already-applied log entries`).
   Raft's rule (Figure 2, AppendEntries step 3-4): delete only from the first entry whose term conflicts with a
   new one, append the entries not already in the log, and commit at most up to the last new entry. Here the
   entries already held with the same term are skipped before pysyncobj sees the message; when nothing new is
   left, the message is answered like a heartbeat whose commit index is bounded by the last entry it carried.
2. Leader: the `next_node_idx` branch sets `nextIndex` from every successful ack, so an ack for an early batch,
   arriving after later batches were sent, moves `nextIndex` backwards and those batches go out again. Here a
   successful ack never moves it backwards (a failed or reset ack still does, which is how Raft backs off).
3. Elections: `__connectedToAnyone` counts non-voting members too, so a voter that no other voter accepts (a
   joiner whose add has not committed, a removed node) but that a non-voting member reached runs elections and
   bumps its term, which later disrupts the leader. Here only connected voters count.
4. Leader: membership changes one at a time. `SyncObj.__changeCluster` means to refuse a change while the previous
   one is not committed, but 0.3.17 never sets the index it checks (`__changeClusterIDx`), so a leader appends
   any number of changes at once, each taking effect on append. Seen: a new leader appended three removals in one
   tick, found itself the only voter, committed alone, while the voters it had removed (not knowing it) elected
   another leader for the same index (a log-matching violation after every agent left at once). Here a change
   is refused while the previous one this leader appended in its term is not applied; the pysyncobj check that
   the new leader's no-op committed first (the single-server-change bug in Raft's dissertation) stays.
5. Leader: new entries and a new commit index go out at once. pysyncobj sends appends only every
   `appendEntriesPeriod` (the period is also the idle heartbeat), so each commit waited up to two periods and a
   short period (fast commits) cost idle CPU on every node. Here the leader sends right after it appended
   commands or advanced its commit index, so the period only paces idle heartbeats. A batch sent again before
   its ack is harmless with 1 and 2 above.
6. A tick ends in a poll that handles the messages already waiting (`SyncObj._onTick`: `self._poller.poll(
   timeToWait)`, here with 0), but what they call for (a leader advancing its commit index on an ack or appending
   a forwarded command, a follower applying a newer commit index) happens only at the next tick. `messages_handled`
   counts the messages that call for a tick so that the node's thread ticks again at once instead of sleeping until
   its next timer (up to the 0.15 s append period: a tenth to a quarter of the submits through a follower took
   ~155 ms instead of ~5 ms). A message that calls for none is not counted: one after which Raft's state (term,
   role, leader, vote, log, commit and applied indexes, configuration, readiness) is what it was, while every
   entry is committed and applied: an idle leader's heartbeat as its follower handles it, the follower's ack as the
   leader does (only these two kinds: a forwarded command, a vote, anything else always counts). Everything such
   a message does happens in its handler (the election deadline, the reply, the
   leader's response times); the node's thread then sleeps on without a tick (`RaftNode`).
7. Leader: an idle heartbeat goes to a non-voting member every other append period. It votes for nothing, so
   what it needs from an idle leader is only to keep hearing it (its agent's fence publishes a leader heard within
   the longest election timeout, 1 s; the period is 0.15 s) and to keep its connection read within the 1 s
   `connectionTimeout`; each heartbeat and its ack cost the leader a message each way, per member (31 at 32
   agents). A member the leader has anything new for (an entry past its next index, a commit index or a term it
   was not sent) gets the append at once, as before (5).
The hook: every applied entry (no-op, membership change and command alike) passes through `on_applied(index,
term, command, result)`, which the RaftNode uses for the running hash of its log and its trace; every vote this
node grants passes through `on_vote(term, candidate, request)` (for the trace).
Invariant kept: for entries it already holds with the leader's term, a follower's log and commit index never go
backwards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pysyncobj import SyncObj
from pysyncobj.monotonic import monotonic as monotonic_time

OnApplied = Callable[[int, int, bytes, Any], None]
ROUTINE = frozenset({"append_entries", "next_node_idx"})   # may call for no tick (6); any other message does
READONLY_IDLE_PERIODS = 1.5     # an idle non-voting member sent nothing within this many append periods gets one (7)


class JobSyncObj(SyncObj):
    def __init__(self, *args: Any, on_applied: OnApplied,
                 on_vote: Callable[[int, str, dict], None] = lambda term, candidate, request: None,
                 **kwargs: Any) -> None:
        self._on_applied = on_applied
        self._on_vote = on_vote
        self._change_pending: tuple[int, int] | None = None     # (term, index) of the last change appended
        self.leader_heard_at = 0.0                                  # pysyncobj's clock: the last append of a leader
        self.messages_handled = 0                                   # 6: read by the node's loop around each tick
        self._readonly_told: dict = {}                              # 8: node -> ((term, commit) sent, when)
        super().__init__(*args, **kwargs)

    # --- 1 and 2: the message handler ---------------------------------------------------------------

    def _SyncObj__onMessageReceived(self, node, message):     # overrides SyncObj.__onMessageReceived
        before = self._raft_state()
        self._handle(node, message)
        kind = message.get("type") if isinstance(message, dict) else None
        if kind not in ROUTINE or self._raft_state() != before or not self._settled():
            self.messages_handled += 1

    def _raft_state(self) -> tuple:
        """What a tick after a message could act on (see 6 above)."""
        return (self._SyncObj__raftCurrentTerm, self._SyncObj__raftState, self._SyncObj__raftLeader,
                self._SyncObj__votedForNodeId, self._SyncObj__getCurrentLogIndex(), self._SyncObj__raftCommitIndex,
                self._SyncObj__raftLastApplied, len(self._SyncObj__otherNodes), self._SyncObj__onReadyCalled)

    def _settled(self) -> bool:
        """Every entry of the log is committed and applied: an ack or a heartbeat calls for no tick."""
        return (self._SyncObj__onReadyCalled and
                self._SyncObj__getCurrentLogIndex() == self._SyncObj__raftCommitIndex == self._SyncObj__raftLastApplied)

    def _handle(self, node, message) -> None:
        if not isinstance(message, dict) or "type" not in message:
            return
        kind = message["type"]
        if kind == "append_entries" and message.get("term", -1) >= self._SyncObj__raftCurrentTerm:
            self.leader_heard_at = monotonic_time()
        if kind == "request_vote":
            self._on_request_vote(node, message)
        elif kind == "append_entries" and self._is_plain_append(message):
            self._on_append(node, message)
        elif kind == "next_node_idx" and message.get("success") and not message.get("reset"):
            before = self._SyncObj__raftNextIndex.get(node)
            super()._SyncObj__onMessageReceived(node, message)
            after = self._SyncObj__raftNextIndex.get(node)
            if before is not None and after is not None and after < before:
                self._SyncObj__raftNextIndex[node] = before
        else:
            super()._SyncObj__onMessageReceived(node, message)

    def _on_request_vote(self, node, message: dict) -> None:
        before = (self._SyncObj__raftCurrentTerm, self._SyncObj__votedForNodeId)
        super()._SyncObj__onMessageReceived(node, message)
        after = (self._SyncObj__raftCurrentTerm, self._SyncObj__votedForNodeId)
        if after[1] is not None and after != before:
            self._on_vote(after[0], after[1], message)

    def _is_plain_append(self, message: dict) -> bool:
        return ("prevLogIdx" in message and message.get("transmission") is None
                and message["term"] >= self._SyncObj__raftCurrentTerm)

    def _on_append(self, node, message: dict) -> None:
        """Pass on only the entries this log does not hold yet with the same term (see 1 above)."""
        handle = super()._SyncObj__onMessageReceived
        entries = message.get("entries", [])
        if not self._holds(message["prevLogIdx"], message["prevLogTerm"]):
            handle(node, message)                  # pysyncobj answers the mismatch and the leader backs off
            return
        held = 0
        while held < len(entries) and self._holds(entries[held][1], entries[held][2]):
            held += 1
        if held < len(entries):
            if held:
                message = dict(message, entries=entries[held:], prevLogIdx=entries[held - 1][1],
                               prevLogTerm=entries[held - 1][2])
            handle(node, message)                  # truncates only from a real conflict at prevLogIdx + 1
            return
        last = entries[-1][1] if entries else message["prevLogIdx"]
        if not entries and self._SyncObj__getCurrentLogIndex() == last:
            handle(node, message)                  # a heartbeat at the end of the log: nothing to protect
            return
        # Everything is held: leader, term and commit index go through pysyncobj's heartbeat path, with the
        # commit bounded by the last entry the leader vouched for; then acknowledge exactly that much.
        heartbeat = {k: v for k, v in message.items() if k not in ("entries", "prevLogIdx", "prevLogTerm")}
        heartbeat["commit_index"] = min(message["commit_index"], last)
        handle(node, heartbeat)
        self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=last + 1, success=True)

    def _holds(self, index: int, term: int) -> bool:
        entries = self._SyncObj__getEntries(index, 1)
        return bool(entries) and entries[0][1] == index and entries[0][2] == term

    # --- 4: one membership change at a time ---------------------------------------------------------

    def _SyncObj__changeCluster(self, request):                 # overrides SyncObj.__changeCluster
        term = self._SyncObj__raftCurrentTerm
        pending = self._change_pending
        if pending is not None and pending[0] == term and self.raftLastApplied < pending[1]:
            return False                                       # the previous change is not committed yet
        accepted = super()._SyncObj__changeCluster(request)
        if accepted:
            self._change_pending = (term, self._SyncObj__getCurrentLogIndex() + 1)   # where the caller appends it
        return accepted

    def _SyncObj__connectedToAnyone(self):                  # overrides SyncObj.__connectedToAnyone
        others = self.otherNodes
        return not others or any(self.isNodeConnected(node) for node in others)

    # --- 5: send at once what followers are waiting for ---------------------------------------------

    def _checkCommandsToApply(self):                           # overrides SyncObj._checkCommandsToApply
        before = self._SyncObj__getCurrentLogIndex()
        super()._checkCommandsToApply()
        if self._isLeader() and self._SyncObj__getCurrentLogIndex() != before:
            self._SyncObj__sendAppendEntries()

    # --- 8: idle heartbeats to non-voting members every other period ---------------------------------

    def _SyncObj__sendAppendEntries(self):                      # overrides SyncObj.__sendAppendEntries
        readonly = self._SyncObj__readonlyNodes
        told, now = self._readonly_told, monotonic_time()
        mark = (self._SyncObj__raftCurrentTerm, self._SyncObj__raftCommitIndex)
        idle = {node for node in readonly if self._told_recently(node, mark, now)}
        readonly.difference_update(idle)
        try:
            super()._SyncObj__sendAppendEntries()
        finally:
            readonly.update(idle & self._SyncObj__connectedNodes)
        for node in list(told):
            if node not in readonly:
                del told[node]
        for node in readonly - idle:
            told[node] = (mark, now)

    def _told_recently(self, node, mark: tuple[int, int], now: float) -> bool:
        """The non-voting member `node` was sent this term and commit index within READONLY_IDLE_PERIODS append
        periods, and holds every entry."""
        told = self._readonly_told.get(node)
        return (told is not None and told[0] == mark
                and now - told[1] < READONLY_IDLE_PERIODS * self._SyncObj__conf.appendEntriesPeriod
                and self._SyncObj__raftNextIndex.get(node, 0) > self._SyncObj__getCurrentLogIndex())

    def _SyncObj__applyLogEntries(self):                        # overrides SyncObj.__applyLogEntries
        before = self.raftLastApplied
        need_send = super()._SyncObj__applyLogEntries()
        return need_send or (self._isLeader() and self.raftLastApplied != before)

    # --- 7: observing applied entries ---------------------------------------------------------------

    def _SyncObj__doApplyCommand(self, command):              # overrides SyncObj.__doApplyCommand
        index = self.raftLastApplied + 1
        entries = self._SyncObj__getEntries(index, 1)
        term = entries[0][2] if entries else 0
        result = super()._SyncObj__doApplyCommand(command)
        self._on_applied(index, term, command, result)
        return result
