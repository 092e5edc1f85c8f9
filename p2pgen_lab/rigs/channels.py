"""Fault-injection harness for channels on real processes (CPU): the messages each mode loses or duplicates.

A *cell* is one (mode, fault, message size): a receiver process and a sender process stream
seq-stamped, self-checking messages while this process, acting as the agent, injects faults:
    F1  SIGKILL the receiver, restart it as a new incarnation on the same port, tell the sender
        (a new generation naming the new incarnation);
    F2  the sender aborts its own link and moves to a new generation;
    F3  SIGSTOP the receiver for 100-800 ms, then SIGCONT (only pauses past the sender's stall timeout
        trip recovery).
When the stream ends, the receiver's consumption log (append-only, every consumption recorded) is the
ground truth: a loss is a number below the stream length missing from it, a duplicate is a repeated
record. The worker processes (`python -m p2pgen_lab.rigs.channels sender|receiver ...`) take commands on
stdin and answer on stdout, one line each.

Invariants: every process this harness starts is stopped (SIGCONT, then SIGKILL, by pid) before a cell
returns; ports are drawn from 20000-31999 and redrawn on EADDRINUSE.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from p2pgen.channel.config import ChannelConfig
from p2pgen.channel.log import channel_path, scan
from p2pgen.transport.group import Endpoint

JOB = "channel-bench"
SENDER, RECEIVER = "prefill", "decode"
PORT_RANGE = (20000, 32000)
FAULTS = ("F1", "F2", "F3")
_PORT_IN_USE = 3
_GOLDEN = 0x9E3779B97F4A7C15


# ---- messages ---------------------------------------------------------------------------------
def make_payload(seq: int, size: int) -> bytes:
    """`size` bytes (a multiple of 8, >= 16): the number, then a word derived from it."""
    words = np.full(size // 8, (seq * _GOLDEN) & (2**64 - 1), dtype=np.uint64)
    words[0] = seq
    return words.tobytes()


def check_payload(seq: int, payload: memoryview) -> bool:
    words = np.frombuffer(payload, dtype=np.uint64)
    return len(words) >= 2 and int(words[0]) == seq and bool(np.all(words[1:] == (seq * _GOLDEN) & (2**64 - 1)))


# ---- worker processes -------------------------------------------------------------------------
def _stdin_commands(handler) -> threading.Thread:
    def loop() -> None:
        for line in sys.stdin:
            handler(line.split())
    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def _say(*parts) -> None:
    print(*parts, flush=True)


def receiver_main(args: argparse.Namespace) -> int:
    from p2pgen.channel.receiver import ChannelListener

    try:
        listener = ChannelListener(JOB, _secret(args), (RECEIVER, args.inc), args.log_dir, port=args.port,
                                   config=ChannelConfig())
    except OSError as e:
        print(f"cannot listen on port {args.port}: {e}", file=sys.stderr)
        return _PORT_IN_USE
    rx = listener.receiver(SENDER)
    stop = threading.Event()
    _stdin_commands(lambda cmd: stop.set() if cmd == ["stop"] else None)
    _say("ready", listener.port)
    bad = 0
    while True:
        msg = rx.receive(timeout=0.05)
        if msg is None:
            if stop.is_set():
                break
            continue
        bad += not check_payload(msg.seq, msg.payload)
        if args.consume_delay:
            time.sleep(args.consume_delay)
        msg.consumed()
    _say("stats", json.dumps({**listener.stats(), "corrupt_consumed": bad}))
    listener.close()
    return 0


def sender_main(args: argparse.Namespace) -> int:
    from p2pgen.channel.sender import Channel

    remote = Endpoint(RECEIVER, args.remote_inc, "127.0.0.1", args.port)
    ch = Channel(JOB, _secret(args), (SENDER, args.inc), remote, mode=args.mode, generation=0,
                 config=ChannelConfig(window=args.window))
    finish = threading.Event()

    def command(cmd: list[str]) -> None:
        if cmd[0] == "gen":
            g, inc, port = map(int, cmd[1:])
            _try(ch.on_generation, g, Endpoint(RECEIVER, inc, "127.0.0.1", port))
        elif cmd[0] == "status":
            _say("status", json.dumps(ch.stats()))
        elif cmd[0] == "finish":
            finish.set()

    seq = ch.resume_seq
    _say("ready", seq)
    _stdin_commands(command)
    payloads = [make_payload(0, args.size)] if args.size > 64 << 10 else None
    start = time.perf_counter()
    while not finish.is_set() and (args.count == 0 or seq < args.count):
        seq = ch.send(payloads[0] if payloads else make_payload(seq, args.size)) + 1
    ch.flush()
    elapsed = time.perf_counter() - start
    _say("done", json.dumps({"sent": seq, "seconds": elapsed, **ch.stats()}))
    ch.close()
    return 0


def _try(fn, *args) -> None:
    try:
        fn(*args)
    except Exception as e:   # reported, not fatal: the channel keeps recovering in the background
        print(f"{fn.__name__}: {e}", file=sys.stderr, flush=True)


def _secret(args: argparse.Namespace) -> bytes:
    with open(args.secret_file, "rb") as f:
        return f.read().strip()


# ---- orchestration ----------------------------------------------------------------------------
class Worker:
    """A worker process with its stdout read into a queue of lines."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "p2pgen_lab.rigs.channels", *argv],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def expect(self, word: str, timeout: float) -> list[str]:
        """The next stdout line starting with `word`, split once; RuntimeError if the process exits."""
        end = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"{self.proc.args[3:5]}: no {word!r} line within {timeout}s") from None
            if line is None:
                raise RuntimeError(f"{self.proc.args[3:5]} exited with {self.proc.wait()} before {word!r}")
            if line.split(" ", 1)[0] == word:
                return line.split(" ", 1)

    def tell(self, *words) -> None:
        self.proc.stdin.write(" ".join(map(str, words)) + "\n")
        self.proc.stdin.flush()

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        """Make sure the process is gone: SIGCONT (it may be stopped), then SIGKILL, by pid."""
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


@dataclass
class Cell:
    mode: str
    fault: str
    size: int
    injections: int
    triggers: int = 0             # recoveries the sender ran
    sent: int = 0                 # stream length
    losses: int = 0
    duplicates: int = 0
    corrupt_consumed: int = 0     # messages that failed the payload check yet were consumed (must be 0)
    receiver: dict = field(default_factory=dict)


class Run:
    """One stream between a receiver and a sender process, with this process as their agent."""

    def __init__(self, workdir: str, mode: str, size: int, window: int, consume_delay: float) -> None:
        self.workdir, self.mode, self.size, self.window = workdir, mode, size, window
        self.consume_delay = consume_delay
        self.secret_file = os.path.join(workdir, "secret")
        with open(self.secret_file, "wb") as f:
            f.write(os.urandom(32).hex().encode())
        self.log_dir = os.path.join(workdir, "logs")
        self.generation, self.inc = 0, 1
        self.port = 0
        self.rx: Worker | None = None
        self.tx: Worker | None = None

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc) -> None:
        for w in (self.tx, self.rx):
            if w is not None:
                w.stop()

    def start(self, count: int = 0) -> None:
        self.start_receiver(random_port=True)
        self.tx = Worker(["sender", "--secret-file", self.secret_file, "--inc", "1", "--remote-inc",
                          str(self.inc), "--port", str(self.port), "--mode", self.mode, "--size",
                          str(self.size), "--window", str(self.window), "--count", str(count)])
        self.tx.expect("ready", 30)

    def start_receiver(self, random_port: bool = False) -> None:
        rng = random.Random()
        for _ in range(50):
            port = rng.randrange(*PORT_RANGE) if random_port else self.port
            self.rx = Worker(["receiver", "--secret-file", self.secret_file, "--inc", str(self.inc), "--port",
                              str(port), "--log-dir", self.log_dir, "--consume-delay", str(self.consume_delay)])
            try:
                self.port = int(self.rx.expect("ready", 30)[1])
                return
            except RuntimeError:
                if self.rx.proc.wait() != _PORT_IN_USE:
                    raise
                time.sleep(0.05)
        raise OSError(f"no free port in {PORT_RANGE}")

    def status(self) -> dict:
        self.tx.tell("status")
        return json.loads(self.tx.expect("status", 30)[1])

    def inject(self, fault: str, rng: random.Random, pause: tuple[float, float] = (0.1, 0.8)) -> None:
        if fault == "F1":
            self.rx.signal(signal.SIGKILL)
            self.rx.stop()
            self.inc += 1
            self.start_receiver()
            self.generation += 1
            self.tx.tell("gen", self.generation, self.inc, self.port)
        elif fault == "F2":
            self.generation += 1
            self.tx.tell("gen", self.generation, self.inc, self.port)
        else:
            self.rx.signal(signal.SIGSTOP)
            time.sleep(rng.uniform(*pause))
            self.rx.signal(signal.SIGCONT)

    def wait_flowing(self, timeout: float = 30.0) -> None:
        """Wait until `window` more messages completed: the stream is past the fault."""
        end = time.monotonic() + timeout
        target = self.status()["completed"] + self.window
        while self.status()["completed"] < target:
            if time.monotonic() > end:
                raise RuntimeError(f"stream did not recover within {timeout}s: {self.status()}")
            time.sleep(0.01)

    def finish(self) -> tuple[dict, dict]:
        """End the stream: the sender flushes, then the receiver drains and stops. (sender, receiver) stats."""
        self.tx.tell("finish")
        sent = json.loads(self.tx.expect("done", 120)[1])
        self.rx.tell("stop")
        received = json.loads(self.rx.expect("stats", 60)[1])
        return sent, received

    def ledger(self, n: int) -> tuple[int, int]:
        """(losses, duplicates) per the receiver's consumption log, for a stream of `n` messages."""
        state = scan(channel_path(self.log_dir, JOB, SENDER, RECEIVER))
        consumed = state.consumed
        have = min(consumed.watermark, n) + sum(1 for s in consumed.above if s < n)
        return n - have, state.repeats


def run_cell(mode: str, fault: str, size: int, injections: int, *, window: int = 32, seed: int = 0,
             gap: tuple[float, float] = (0.02, 0.12), pause: tuple[float, float] = (0.1, 0.8),
             consume_delay: float = 0.0) -> Cell:
    """Stream, inject `injections` faults of one kind at random points (`gap` seconds after the stream
    recovered from the previous one; F3 pauses last `pause` seconds), count losses and duplicates."""
    rng = random.Random(seed)
    cell = Cell(mode, fault, size, injections)
    with tempfile.TemporaryDirectory(prefix="p2pgen-channel-") as workdir, \
            Run(workdir, mode, size, window, consume_delay) as run:
        run.start()
        run.wait_flowing()
        for _ in range(injections):
            time.sleep(rng.uniform(*gap))
            run.inject(fault, rng, pause)
            run.wait_flowing()
        sent, received = run.finish()
        cell.sent, cell.triggers = sent["sent"], sent["recoveries"]
        cell.losses, cell.duplicates = run.ledger(cell.sent)
        cell.corrupt_consumed = received.pop("corrupt_consumed")
        cell.receiver = received
    return cell


def throughput(mode: str, size: int, count: int, *, window: int = 32) -> float:
    """Fault-free messages per second, one stream of `count` messages (sender's clock, first send to
    the last completion)."""
    with tempfile.TemporaryDirectory(prefix="p2pgen-channel-") as workdir, \
            Run(workdir, mode, size, window, 0.0) as run:
        run.start(count=count)
        sent = json.loads(run.tx.expect("done", 600)[1])
        return count / sent["seconds"]


def cell_json(cell: Cell) -> dict:
    return asdict(cell)


# ---- entry point of the worker processes ------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m p2pgen_lab.rigs.channels")
    sub = p.add_subparsers(dest="role", required=True)
    r = sub.add_parser("receiver")
    r.add_argument("--log-dir", required=True)
    r.add_argument("--consume-delay", type=float, default=0.0)
    s = sub.add_parser("sender")
    s.add_argument("--remote-inc", type=int, required=True)
    s.add_argument("--mode", required=True)
    s.add_argument("--size", type=int, required=True)
    s.add_argument("--window", type=int, default=32)
    s.add_argument("--count", type=int, default=0)
    for q in (r, s):
        q.add_argument("--secret-file", required=True)
        q.add_argument("--inc", type=int, required=True)
        q.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)   # refusals and torn frames are expected here, and counted
    return receiver_main(args) if args.role == "receiver" else sender_main(args)


if __name__ == "__main__":
    sys.exit(main())
