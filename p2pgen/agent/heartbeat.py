"""Heartbeats between agents and the runner of the failure detector.

Owns: a UDP socket on the agent's control address, signed heartbeats sent to every other Raft node's
agent, the arrival history, and the calls to the pure `p2pgen.detect.suspects` decision.
Invariants kept:
- a heartbeat that is not signed with the job's key, or comes from an agent that is not a current
  Raft node, is ignored (I8): an outsider can neither keep a dead peer alive nor get one evicted;
- our own stall (a SIGSTOP, a long GC) is never blamed on others: after a gap longer than the
  detector's floor every peer's history restarts from now;
- each suspicion is reported once until the peer is heard from again.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Callable

import msgpack

from p2pgen.auth import prove, verify
from p2pgen.detect import DetectorConfig, HeartbeatHistory, suspects

log = logging.getLogger(__name__)

TAG_BYTES = 32


class HeartbeatRunner:
    def __init__(self, host: str, port: int, key: bytes, job: str, self_addr: str, config: DetectorConfig,
                 targets: Callable[[], set[str]], on_suspect: Callable[[str, str], None]) -> None:
        self.key, self.job, self.self_addr, self.config = key, job, self_addr, config
        self._targets, self._on_suspect = targets, on_suspect
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((host, port))
        self._sock.settimeout(config.heartbeat_interval / 4)
        self._history = HeartbeatHistory(config.window)
        self._reported: set[str] = set()
        self._lock = threading.Lock()            # guards _reported, read by other threads via suspected()
        self._stop = threading.Event()
        self._seq = 0
        self._reset_requested = False
        self._renewed: set[str] = set()          # peers admitted again at the same address, to judge afresh
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self_addr}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        self._sock.close()

    def suspected(self) -> set[str]:
        """Agents currently suspected (reported and not heard from since)."""
        with self._lock:
            return set(self._reported)

    def _run(self) -> None:
        next_send = last_loop = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now - last_loop > self.config.floor:
                self._forgive_all(now, now - last_loop)
            elif self._reset_requested:
                self._reset_requested = False
                self._forgive(now)
            self._judge_renewed_afresh(now)
            last_loop = now
            targets = self._targets() - {self.self_addr}
            self._track(targets, now)
            if now >= next_send:
                self._send(targets)
                next_send = now + self.config.heartbeat_interval
            self._receive(targets)
            if time.monotonic() - now < self.config.floor:   # stalled inside this round: judge next round
                self._judge(targets, time.monotonic())

    def reset(self) -> None:
        """Start every peer's history afresh (after this agent rejoined the job): what we heard while we
        were cut off says nothing about the others."""
        self._reset_requested = True

    def renew(self, peer: str) -> None:
        """A new agent was admitted at `peer`'s address: the silence of the one that died there before is
        not its silence. Its suspicion is withdrawn now; its history restarts on the next round."""
        with self._lock:
            self._reported.discard(peer)
            self._renewed.add(peer)

    def _judge_renewed_afresh(self, now: float) -> None:
        with self._lock:
            renewed, self._renewed = self._renewed, set()
        for peer in renewed:
            self._history.forget(peer)
            self._history.record(peer, now)

    def _forgive_all(self, now: float, gap: float) -> None:
        log.warning("this agent stalled for %.2f s; restarting every peer's heartbeat history", gap)
        self._forgive(now)

    def _forgive(self, now: float) -> None:
        with self._lock:
            self._reported.clear()
        for peer in self._history.peers():
            self._history.forget(peer)
            self._history.record(peer, now)

    def _track(self, targets: set[str], now: float) -> None:
        known = set(self._history.peers())
        for peer in targets - known:
            self._history.record(peer, now)       # a new node gets a full timeout before judgement
        for peer in known - targets:
            self._history.forget(peer)
            with self._lock:
                self._reported.discard(peer)

    def _send(self, targets: set[str]) -> None:
        self._seq += 1
        body = msgpack.packb([self.job, self.self_addr, self._seq])
        packet = body + prove(self.key, body)
        for target in targets:
            host, _, port = target.rpartition(":")
            try:
                self._sock.sendto(packet, (host, int(port)))
            except OSError as e:
                log.debug("heartbeat to %s failed: %s", target, e)

    def _receive(self, targets: set[str]) -> None:
        try:
            packet, _ = self._sock.recvfrom(4096)
        except (socket.timeout, OSError):
            return
        body, tag = packet[:-TAG_BYTES], packet[-TAG_BYTES:]
        if len(packet) <= TAG_BYTES or not verify(self.key, tag, body):
            log.debug("dropped an unsigned or forged heartbeat")
            return
        try:
            job, sender, _seq = msgpack.unpackb(body)
        except (ValueError, msgpack.UnpackException):
            return
        if job == self.job and sender in targets:
            self._history.record(sender, time.monotonic())
            with self._lock:
                self._reported.discard(sender)

    def _judge(self, targets: set[str], now: float) -> None:
        for peer, reason in suspects(now, self._history, self.config).items():
            if peer in targets and peer not in self._reported:
                with self._lock:
                    self._reported.add(peer)
                self._on_suspect(peer, reason)
