"""The sending side of a point-to-point channel: sequence numbers, a bounded window, and recovery.

    ch = Channel(job, secret, self_id=("prefill", inc), remote=Endpoint("decode", inc_d, host, port))
    for i in range(ch.resume_seq, n):    # a new sender incarnation resumes from the receiver's log
        ch.send(block(i))
    ch.flush()
    ...
    ch.on_generation(g, remote=...)      # the peer calls this on every generation change

A Channel holds every message it sent until it sees that message *complete* (in `exactly_once` mode:
consumed, per the receiver's ACK or its log; in `naive`/`batched` mode: delivered, per message or per
batch). After any fault (the connection failed, no completion for `stall_timeout`) or generation change,
a supervisor thread aborts the link, dials again, reads the receiver's consumption log and resends: in
`exactly_once` mode exactly the held numbers the log lacks; in the other modes every held number. The
application's sends wait meanwhile.

Invariants:
- At most `window` messages are held (sent, not complete): the sender's memory is bounded.
- I6: in `exactly_once` mode a message leaves the window only when the receiver reported it consumed;
  the sender's own completion (a finished write) never counts.
- A message is written to a link at most once: a send either finished writing before the link was
  aborted (the abort waits for it) or is resent on the next link, never both.
- Sends resume on a new link only after its resends were written, so numbers go out in order.
- With `config.encrypt` every frame of every link is sealed (`p2pgen.transport.seal`); a receiver with the
  other setting fails the channel with EncryptionMismatch (retrying cannot help), as an eviction does.
"""

from __future__ import annotations

import errno
import logging
import socket
import struct
import threading
from collections.abc import Callable

from p2pgen import auth
from p2pgen.channel.config import BATCHED, EXACTLY_ONCE, ChannelConfig, check_mode
from p2pgen.channel.log import ConsumedSet
from p2pgen.channel.receiver import _tune
from p2pgen.channel.wire import (
    ACK,
    DATA,
    LOG,
    OPEN,
    Stamp,
    encode,
    frame_bytes,
    parse_header,
    read_payload,
    recv_control,
    send_control,
    write_frame,
)
from p2pgen.errors import EncryptionMismatch, Evicted, GenerationChanged, P2PGenError, PeerLost, ProtocolError
from p2pgen.transport import frame, handshake
from p2pgen.transport.group import Endpoint
from p2pgen.transport.seal import Seal

log = logging.getLogger(__name__)

_ACKS_PER_READ = 256
_MAX_RETRY_INTERVAL = 0.5


class _Link:
    """One connection of the channel, bound to one generation and one receiver incarnation."""

    def __init__(self, sock: socket.socket, generation: int, remote: Endpoint, tag: int, me: int,
                 seal: Seal | None = None) -> None:
        self.sock = sock
        self.seal = seal
        self.generation = generation
        self.remote = remote
        self.stamp_out = Stamp(tag, generation, me)
        self.stamp_in = Stamp(tag, generation, remote.incarnation)
        self.send_lock = threading.Lock()
        self.dead = False
        self.reader: threading.Thread | None = None

    def write(self, seq: int, item: tuple[int, bytes]) -> None:
        write_frame(self.sock, DATA, self.stamp_out, seq, item[0], item[1], self.seal)

    def shutdown(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def abort(self) -> None:
        """Wake every thread on this link, wait for the write in progress, close (RST, not FIN)."""
        self.shutdown()
        with self.send_lock:
            if self.dead:
                return
            self.dead = True
        if self.reader is not None:
            self.reader.join()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


class Channel:
    """The sending end of the channel self_id -> remote.peer_id of `job`."""

    def __init__(self, job: str, secret: bytes, self_id: tuple[str, int], remote: Endpoint, *,
                 mode: str = EXACTLY_ONCE, generation: int = 0, config: ChannelConfig | None = None) -> None:
        if not secret:
            raise ValueError("the job secret is empty: load it with p2pgen.auth.load_secret")
        self.job = job
        self.identity = (self_id[0], int(self_id[1]))
        self.mode = check_mode(mode)
        self.config = config or ChannelConfig()
        self._key = auth.derive_key(secret, job, "channel")
        self._tag = frame.job_tag(job)
        self._clock = self.config.clock
        self._cond = threading.Condition()
        self._target = (generation, remote)
        self._link: _Link | None = None        # published: new sends go here
        self._current: _Link | None = None     # the newest link, published or still resending
        self._want: str | None = "open"        # why the supervisor must (re)connect, if it must
        self._unacked: dict[int, tuple[int, bytes]] = {}
        self._acked: set[int] = set()          # batched mode: delivered, batch not yet complete
        self._final = False
        self._known = ConsumedSet()            # numbers the receiver's last log snapshot held
        self._next = 0
        self._resume: int | None = None
        self._progress = self._clock()
        self._failed: P2PGenError | None = None
        self._closed = False
        self._counts = dict.fromkeys(("sent", "resent", "skipped", "completed", "recoveries"), 0)
        self._faults: dict[str, int] = {}
        self._supervisor = threading.Thread(target=self._supervise, daemon=True,
                                            name=f"p2pgen-channel-{self_id[0]}->{remote.peer_id}")
        self._supervisor.start()

    # ---- application side ----------------------------------------------------------------------
    @property
    def resume_seq(self) -> int:
        """The first number the receiver had not consumed when this Channel first connected: where a
        restarted sender resumes its stream. Waits for the first connection (PeerLost after
        `connect_timeout`)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._resume is not None or self._failed or self._closed,
                                       self.config.connect_timeout):
                raise PeerLost(f"no connection to {self._target[1]} within {self.config.connect_timeout}s")
            self._raise_if_done()
            return self._resume

    def send(self, payload, timeout: float | None = None) -> int:
        """Send bytes, a numpy array or a CPU torch tensor (copied); returns its sequence number.

        Blocks while the window is full or the channel is recovering. A number the receiver's log
        already holds is not sent again (a restarted sender replaying its stream). Call from one thread.
        """
        item = encode(payload)
        with self._cond:
            def ready() -> bool:
                return bool(self._failed or self._closed or (
                    self._link is not None and len(self._unacked) < self.config.window))
            if not self._cond.wait_for(ready, timeout):
                raise TimeoutError(f"window of {self.config.window} still full after {timeout}s")
            self._raise_if_done()
            seq, self._next, self._final = self._next, self._next + 1, False
            if seq in self._known:
                self._counts["skipped"] += 1
                return seq
            if not self._unacked:
                self._progress = self._clock()
            self._unacked[seq] = item
            self._counts["sent"] += 1
            link = self._link
        self._write(link, seq, item)
        return seq

    def _write(self, link: _Link, seq: int, item: tuple[int, bytes]) -> None:
        with link.send_lock:
            if link.dead:
                return        # aborted before we wrote: the supervisor resends it
            try:
                link.write(seq, item)
                return
            except OSError as e:
                error = e
        self._fault(link, f"write failed: {error!r}")

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every message sent is complete (consumed, in `exactly_once` mode); False on timeout."""
        with self._cond:
            self._final = True
            if self.mode == BATCHED and self._next:
                self._complete_batch((self._next - 1) // self.config.batch)
            done = self._cond.wait_for(lambda: not self._unacked or self._failed or self._closed, timeout)
            self._raise_if_done()
            return done

    def on_generation(self, generation: int, remote: Endpoint | None = None) -> None:
        """Move the channel to `generation` (and to `remote`, if the receiver moved or restarted): abort
        the link, reconnect, read the receiver's log and resend. Returns once the new link carries sends;
        PeerLost after `connect_timeout` (the channel keeps trying in the background)."""
        with self._cond:
            old_gen, old_remote = self._target
            if generation < old_gen:
                raise GenerationChanged(f"generation {generation} is older than this channel's {old_gen}")
            remote = remote or old_remote
            if (generation, remote) == (old_gen, old_remote):
                return
            self._target = (generation, remote)
            live, self._link = self._link, None
            if live is not None:               # otherwise a reconnect is under way: it dials the new target
                self._want = f"generation {generation}"
            self._cond.notify_all()
        if live is not None:
            live.shutdown()
        with self._cond:
            if not self._cond.wait_for(lambda: self._failed or self._closed or (
                    self._link is not None and self._link.generation >= generation), self.config.connect_timeout):
                raise PeerLost(f"no link to {remote} in generation {generation} within "
                               f"{self.config.connect_timeout}s; still trying")
            self._raise_if_done()

    def stats(self) -> dict:
        """sent, resent, skipped, completed, recoveries, in_flight, faults (by reason)."""
        with self._cond:
            return {**self._counts, "in_flight": len(self._unacked), "faults": dict(self._faults)}

    def close(self) -> None:
        """Abort the link and stop; unsent and incomplete messages are dropped (a new Channel, even in a
        new process, resumes from the receiver's log). Idempotent."""
        with self._cond:
            self._closed = True
            link, self._current, self._link = self._current, None, None
            self._cond.notify_all()
        if link is not None:
            link.shutdown()
        self._supervisor.join()
        if link is not None:
            link.abort()

    def _raise_if_done(self) -> None:
        if self._failed is not None:
            raise self._failed
        if self._closed:
            raise PeerLost("this channel was closed")

    # ---- completions ---------------------------------------------------------------------------
    def _read_acks(self, link: _Link) -> None:
        size = frame_bytes(0, link.seal)
        buf = bytearray(size * _ACKS_PER_READ)
        have = 0
        try:
            while True:
                try:
                    n = link.sock.recv_into(memoryview(buf)[have:])
                except OSError as e:
                    if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                        raise
                    self._check_stall(link)
                    continue
                if n == 0:
                    raise PeerLost("receiver closed the connection")
                have += n
                whole = have - have % size
                self._on_acks([self._ack_seq(link, buf, off) for off in range(0, whole, size)])
                buf[:have - whole] = buf[whole:have]
                have -= whole
                self._check_stall(link)
        except (OSError, P2PGenError) as e:
            self._fault(link, f"{type(e).__name__}: {e}")

    @staticmethod
    def _ack_seq(link: _Link, buf: bytearray, off: int) -> int:
        raw = buf[off:off + frame.HEADER_BYTES]
        h = parse_header(raw, 0)
        rest = memoryview(buf)[off + frame.HEADER_BYTES:off + frame_bytes(0, link.seal)]
        read_payload(_reader(rest), raw, h, memoryview(bytearray(0)), link.seal)
        if h.kind != ACK or (h.job_tag, h.generation, h.incarnation) != (
                link.stamp_in.tag, link.stamp_in.generation, link.stamp_in.incarnation):
            raise ProtocolError(f"bad ACK frame (kind {h.kind}, stamp {h.generation}/{h.incarnation})")
        return h.op_seq

    def _on_acks(self, seqs: list[int]) -> None:
        with self._cond:
            for seq in seqs:
                if seq not in self._unacked:
                    continue
                if self.mode == BATCHED:
                    self._acked.add(seq)
                    self._complete_batch(seq // self.config.batch)
                else:
                    del self._unacked[seq]
                    self._counts["completed"] += 1
                    self._progress = self._clock()
            self._cond.notify_all()

    def _complete_batch(self, b: int) -> None:
        """Batched mode: release batch `b` once every message of it was delivered (one completion)."""
        lo, hi = b * self.config.batch, (b + 1) * self.config.batch
        if hi > self._next and not self._final:
            return
        members = range(lo, min(hi, self._next))
        if all(s in self._acked or s not in self._unacked for s in members):
            for s in members:
                if self._unacked.pop(s, None) is not None:
                    self._counts["completed"] += 1
                self._acked.discard(s)
            self._progress = self._clock()
            self._cond.notify_all()

    def _check_stall(self, link: _Link) -> None:
        with self._cond:
            stalled = (self._unacked and self._current is link
                       and self._clock() - self._progress > self.config.stall_timeout)
        if stalled:
            self._fault(link, "stall")

    def _fault(self, link: _Link, reason: str) -> None:
        with self._cond:
            if link is not self._current or self._want is not None or self._closed:
                return
            log.info("channel %s -> %s: fault on generation %d: %s", self.identity[0], link.remote.peer_id,
                     link.generation, reason)
            kind = reason.split(":")[0]
            self._faults[kind] = self._faults.get(kind, 0) + 1
            self._want = reason
            self._link = None
            self._cond.notify_all()
        link.shutdown()

    # ---- recovery ------------------------------------------------------------------------------
    def _supervise(self) -> None:
        while self._await_fault():
            while not self._reconnect():
                pass

    def _await_fault(self) -> bool:
        """Wait for a reason to reconnect, then abort the current link; False once closed."""
        with self._cond:
            self._cond.wait_for(lambda: self._want is not None or self._closed)
            if self._closed:
                return False
            self._want, old, self._current = None, self._current, None
        if old is not None:
            old.abort()
        return True

    def _reconnect(self) -> bool:
        """Dial, read the log, resend; False if the target moved meanwhile (dial again)."""
        link, snapshot = self._connect()
        return link is None or self._resend(link, snapshot)

    def _connect(self) -> tuple[_Link | None, tuple[int, list[int]]]:
        """Dial the newest target until it answers; (None, ...) if closed, this incarnation is fenced or the two
        ends disagree on --encrypt."""
        pause = self.config.retry_interval
        while True:
            with self._cond:
                if self._closed:
                    return None, (0, [])
                generation, remote = self._target
            try:
                return self._dial(generation, remote)
            except (Evicted, EncryptionMismatch) as e:      # retrying cannot help: the channel fails with why
                with self._cond:
                    self._failed = e
                    self._cond.notify_all()
                log.error("%s", e)
                return None, (0, [])
            except (OSError, P2PGenError) as e:
                log.debug("channel %s -> %s: dial failed: %s", self.identity[0], remote, e)
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._target != (generation, remote), pause)
            pause = min(2 * pause, _MAX_RETRY_INTERVAL)

    def _dial(self, generation: int, remote: Endpoint) -> tuple[_Link, tuple[int, list[int]]]:
        sock = socket.create_connection((remote.host, remote.port), timeout=self.config.handshake_timeout)
        try:
            _tune(sock, self.config.socket_buffer_bytes)
            hello = handshake.Hello(self.job, generation, self.identity, remote.identity, auth.new_nonce(),
                                    self.config.encrypt)
            keys = handshake.dial(sock, self._key, hello)
            link = _Link(sock, generation, remote, self._tag, self.identity[1],
                         Seal(keys) if keys is not None else None)
            send_control(sock, OPEN, link.stamp_out, {"mode": self.mode}, link.seal)
            reply = recv_control(sock, LOG, link.stamp_in, link.seal)
            snapshot = _log_snapshot(reply, self.identity, remote)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        poll = max(self.config.stall_timeout / 4, 0.001)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", int(poll), int(poll % 1 * 1e6)))
        return link, snapshot

    def _resend(self, link: _Link, snapshot: tuple[int, list[int]]) -> bool:
        """Resend what the receiver's log lacks on `link`, then publish it. False (link aborted) if the
        target moved or the channel closed meanwhile; True otherwise (a fault during the resend is
        flagged and handled by the next round)."""
        with self._cond:
            moved = not self._is_target(link)
            if not moved:
                items, first = self._plan_resend(snapshot)
                self._current = link
                self._progress = self._clock()
                link.reader = threading.Thread(target=self._read_acks, args=(link,), daemon=True,
                                               name=f"p2pgen-channel-acks-g{link.generation}")
        if moved:
            return self._drop(link)
        link.reader.start()
        try:
            with link.send_lock:
                for seq, item in items:
                    link.write(seq, item)
        except OSError as e:
            self._fault(link, f"resend failed: {e!r}")
            return True
        with self._cond:
            if self._want is not None:
                return True
            moved = not self._is_target(link)
            if moved:
                self._current = None
            else:
                self._link = link
                self._progress = self._clock()
                self._counts["resent"] += len(items)
                self._counts["recoveries"] += not first
                self._cond.notify_all()
        return self._drop(link) if moved else True

    def _is_target(self, link: _Link) -> bool:
        return not self._closed and self._target == (link.generation, link.remote)

    def _drop(self, link: _Link) -> bool:
        """Abort a link the target moved away from; True (stop dialing) if the channel closed."""
        link.abort()
        with self._cond:
            return self._closed

    def _plan_resend(self, snapshot: tuple[int, list[int]]) -> tuple[list[tuple[int, tuple[int, bytes]]], bool]:
        """Under the lock: learn the receiver's log; in exactly_once mode complete what it holds. Returns
        the messages to resend, in order, and whether this is the first link of this Channel."""
        self._known = ConsumedSet(*snapshot)
        first = self._resume is None
        if first:
            self._resume = self._next = max(self._next, snapshot[0])
        if self.mode == EXACTLY_ONCE:
            for seq in [s for s in self._unacked if s in self._known]:
                del self._unacked[seq]
                self._counts["completed"] += 1
        self._acked.clear()
        return sorted(self._unacked.items()), first


def _log_snapshot(reply: dict, me: tuple[str, int], remote: Endpoint) -> tuple[int, list[int]]:
    refused = reply.get("refused")
    if refused is None:
        w, above = reply.get("w"), reply.get("above")
        if not isinstance(w, int) or not isinstance(above, list):
            raise ProtocolError(f"malformed LOG reply from {remote}: {reply!r}")
        return w, above
    where = f"{remote.peer_id} (incarnation {remote.incarnation}) refused {me}: {reply.get('detail')}"
    if refused == "superseded":
        raise Evicted(f"{where}; this sender incarnation must stop (a newer one owns the channel)")
    if refused == "stale_generation":
        raise GenerationChanged(where)
    raise ProtocolError(f"{where} ({refused})")


def _reader(data: memoryview) -> Callable[[memoryview], None]:
    """`read_payload`'s `read` over bytes already in the ACK reader's buffer."""
    def read(view: memoryview) -> None:
        view[:] = data[:len(view)]
    return read
