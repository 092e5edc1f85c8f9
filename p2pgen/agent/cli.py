"""`p2pgen join | show | history`: start an agent, inspect a job.

Owns: argument parsing for the agent commands, the human-readable tables of `show` and `history`
(their JSON is the stable form documented in the README), and the `join --local N` demo, which starts
N symmetric agents on 127.0.0.1 and stops every one of them, by pid, on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from datetime import datetime
from typing import Any

from p2pgen.agent.detectflags import add_detector_arguments, config_from_args, detector_flags
from p2pgen.agent.probe import PROBE_BYTES
from p2pgen.agent.statedir import add_state_arguments, state_config_from_args, state_flags
from p2pgen.auth import SecretError, load_secret, read_secret_file
from p2pgen.core.topology import check_zone, rate

NO_SECRET_TO_ENCRYPT = ("--encrypt needs a real job secret: give --secret-file (or $P2PGEN_SECRET_FILE); without "
                        "one the secret derives from the job name, and so would every key")
DEMO_STEP_DELAY_S = 0.5      # `join --local --chaos --steps`: a step paced like (small) real training


def add_commands(sub: argparse._SubParsersAction) -> None:
    join = sub.add_parser("join", help="start an agent: join a job (or start one) and supervise COMMAND",
                          description="Start this host's agent. With no --peer it starts a new job; with peers it "
                                      "joins the running job through any live member (retrying until one answers). "
                                      "The Raft port is PORT+1.")
    join.add_argument("--job", default="demo", help="job name (default: demo)")
    join.add_argument("--id", dest="peer_id", help="stable peer id, e.g. node3/gpu1")
    join.add_argument("--listen", metavar="HOST:PORT", help="control address; PORT+1 is Raft, PORT+2 the application's "
                                                              "data plane, PORT+3 its state transfer, "
                                                              "PORT+4 its channels "
                                                              "(keep all < 32768)")
    join.add_argument("--channel-dir", default="", help="where the application's channel consumption logs live "
                                                          "(default: a per-job, per-peer folder in the temp dir)")
    join.add_argument("--peer", action="append", default=[], metavar="HOST:PORT", help="a member's control address")
    join.add_argument("--secret-file", help="file holding the job secret (default: $P2PGEN_SECRET_FILE, else an "
                                            "insecure demo secret)")
    join.add_argument("--encrypt", action="store_true", default=None,
                      help="seal the application's links (data plane, state transfer, channels) with AES-256-GCM, "
                           "keyed per connection from the job secret; every member must use it (default: "
                           "$P2PGEN_ENCRYPT=1, else off)")
    join.add_argument("--max-restarts", type=int, default=10, help="restarts of a failing COMMAND before leaving")
    join.add_argument("--min-members", type=int, default=1, help="form the first generation only once this many "
                                                                 "members registered (same value on every agent)")
    join.add_argument("--trace-dir", default="", metavar="DIR",
                      help="append this agent's Raft safety trace to DIR (default: $P2PGEN_TRACE_DIR/raft; read by "
                           "`p2pgen.raft.checker`, `p2pgen stress` and `p2pgen chaos`)")
    join.add_argument("--attach-grace", type=float, default=float("inf"), metavar="S",
                      help="seconds after which the agent votes for a COMMAND that has not attached (p2pgen.join) "
                           "as a stateless member; default: never (the application votes itself); use 0 for "
                           "applications that do not use p2pgen")
    join.add_argument("--standby", type=int, default=0, choices=(0, 1), metavar="N",
                      help="keep N (0 or 1) warm standby processes of COMMAND: started without an incarnation, they "
                           "do their imports and wait in p2pgen.join(); when the application dies the standby is "
                           "promoted as its new incarnation and another standby is started (default 0)")
    join.add_argument("--zone", default="", metavar="NAME",
                      help="the zone this host is in (letters, digits, . _ -): members of one zone are ranked next "
                           "to each other, and all_reduce goes hierarchical across 2+ zones of 2+ members "
                           "(default: none; the measured link rates decide)")
    join.add_argument("--probe-mib", type=float, default=PROBE_BYTES / (1 << 20), metavar="MIB",
                      help="first payload of the few requests that measure the link to every other host of the "
                           f"job (doubled up to 8 MiB on a fast link; default {PROBE_BYTES / (1 << 20):g}; "
                           "0: never probe)")
    join.add_argument("--http", type=int, metavar="PORT",
                      help="serve a read-only HTML status page of the job on PORT (with --local: PORT, PORT+1, ... "
                           "for each agent)")
    join.add_argument("--http-bind", default="127.0.0.1", metavar="HOST",
                      help="address of the status page (default 127.0.0.1: the page is not authenticated)")
    join.add_argument("--local", type=int, metavar="N", help="demo: start N agents on 127.0.0.1 and watch them")
    join.add_argument("--base-port", type=int, default=20000, help="--local: first control port (step 5)")
    join.add_argument("--chaos", type=float, metavar="N",
                      help="--local: inject a fault (SIGKILL of an application or of a whole agent, in equal numbers) "
                           "every N committed steps on average with --steps and a COMMAND, every N seconds otherwise; "
                           "each once the job is whole again")
    join.add_argument("--chaos-seed", type=int, default=0, help="--local: seed of the fault schedule")
    join.add_argument("--steps", type=int, help="--local: steps to train (passed to COMMAND as $P2PGEN_STEPS)")
    join.add_argument("--step-delay", type=float, metavar="S",
                      help="--local: seconds of pretend compute per step, passed to COMMAND as $P2PGEN_STEP_DELAY "
                           f"(default with --chaos and --steps: {DEMO_STEP_DELAY_S}, so that recoveries land "
                           "mid-training as on real hardware)")
    join.add_argument("--drain-timeout", type=float, default=25.0, metavar="S",
                      help="on SIGTERM or a spot notice the agent drains (hands its state over, stops the "
                           "application at a step boundary, leaves) and is gone within S seconds, or before the "
                           "notice's termination time if earlier (default 25)")
    join.add_argument("--notice-file", metavar="PATH",
                      help="drain when PATH appears (its content: a termination time, ISO-8601 or epoch seconds, or "
                           "nothing for 'soon'); not watched unless given")
    join.add_argument("--notice-url", metavar="URL",
                      help="poll URL for a spot termination notice (404 or FALSE: none; a JSON `time`, a scheduled "
                           "Preempt event, a time or TRUE: drain); nothing is polled unless given")
    join.add_argument("--notice-interval", type=float, default=1.0, metavar="S",
                      help="seconds between two readings of --notice-file or --notice-url (default 1)")
    add_detector_arguments(join)
    add_state_arguments(join)
    join.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...: the application to supervise")
    join.set_defaults(func=cmd_join)

    for name, func, text in (("show", cmd_show, "the active certificate and pending proposal of a job"),
                             ("history", cmd_history, "the generations of a job so far")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--peer", required=True, metavar="HOST:PORT", help="control address of any member's agent")
        p.add_argument("--secret-file", help="file holding the job secret (default: $P2PGEN_SECRET_FILE)")
        p.add_argument("--json", action="store_true", help="stable JSON (see README)")
        if name == "history":
            p.add_argument("--plot", metavar="FILE",
                           help="draw the timeline (members over time, each change and its reason, time between "
                                "generations, revision progress) to FILE (.png, .svg, .pdf); needs matplotlib "
                                "(the sim extra)")
        if name == "show":
            p.add_argument("--watch", action="store_true",
                           help="keep watching: redraw on each generation change (members, ranks, frontier, last "
                                "fault and its recovery time) until Ctrl-C")
        p.set_defaults(func=func)


    rec = sub.add_parser("recover", help="re-form a job whose Raft majority is gone for good (fenced, new epoch)",
                         description="Re-form the job from its survivors in a new Raft epoch, after a majority of "
                                     "its voters was lost for good (etcd's --force-new-cluster, fenced: the new "
                                     "epoch's keys differ, so no node of the old one can talk to it). Refused, "
                                     "with the reason, while a majority of the voters answers or a leader is heard.")
    rec.add_argument("--peer", action="append", required=True, metavar="HOST:PORT",
                     help="control address of a surviving agent (the others are found from it)")
    rec.add_argument("--gone", action="append", default=[], metavar="HOST:PORT",
                     help="control address of an agent gone for good (its members are evicted)")
    rec.add_argument("--secret-file", help="file holding the job secret (default: $P2PGEN_SECRET_FILE)")
    rec.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for each survivor to re-form")
    rec.set_defaults(func=cmd_recover)


def cmd_recover(args: argparse.Namespace) -> int:
    from p2pgen.agent.recover import Recovery
    try:
        secret = read_secret_file(args.secret_file)
    except SecretError as e:
        print(f"p2pgen recover: {e}", file=sys.stderr)
        return 2
    plan = Recovery(args.peer, args.gone, secret, None, args.timeout).run(lambda line: print(line, flush=True))
    if not plan.ok:
        print(f"p2pgen recover: refused: {plan.reason}", file=sys.stderr)
        return 1
    print(f"re-formed: Raft epoch {plan.epoch}, seed {plan.seed}, {len(plan.followers)} other survivor(s)")
    return 0


def _command(args: argparse.Namespace) -> list[str] | None:
    command = list(args.command or [])
    if command and command[0] == "--":
        command = command[1:]
    return command or None


def cmd_join(args: argparse.Namespace) -> int:
    if args.local:
        return run_local_demo(args)
    if not args.peer_id or not args.listen:
        print("p2pgen join: --id and --listen are required (or use --local N)", file=sys.stderr)
        return 2
    from p2pgen.agent.agent import Agent, AgentConfig, JoinError
    try:
        detector = config_from_args(args)
        state = state_config_from_args(args)
        secret = load_secret(args.secret_file, args.job)
        bad_zone = check_zone(args.zone)
        if bad_zone or args.probe_mib < 0:
            raise ValueError(f"--zone: {bad_zone}" if bad_zone else "--probe-mib must be >= 0 (0: never probe)")
        if args.drain_timeout <= 0:
            raise ValueError(f"--drain-timeout {args.drain_timeout}: give a positive number of seconds")
        encrypt = _encrypt(args)
        if encrypt and read_secret_file(args.secret_file) is None:
            raise ValueError(NO_SECRET_TO_ENCRYPT)
        agent = Agent(AgentConfig(job=args.job, peer_id=args.peer_id, listen=args.listen, secret=secret,
                                  secret_file=args.secret_file and os.path.abspath(args.secret_file), peers=args.peer,
                                  command=_command(args), max_restarts=args.max_restarts,
                                  min_members=args.min_members, detector=detector, trace_dir=args.trace_dir,
                                  attach_grace=args.attach_grace, channel_dir=args.channel_dir, state=state,
                                  standby=args.standby, encrypt=encrypt, drain_timeout=args.drain_timeout,
                                  notice_file=args.notice_file, notice_url=args.notice_url,
                                  notice_interval=args.notice_interval, zone=args.zone,
                                  probe_bytes=int(args.probe_mib * (1 << 20))))
    except (ValueError, SecretError) as e:
        print(f"p2pgen join: {e}", file=sys.stderr)
        return 2
    # The handler runs on the main thread, which is the agent's driver, between two bytecodes: possibly while
    # that thread holds the lock of the event queue it waits on. Queueing "leave" from the handler itself can
    # then deadlock (the agent never leaves); a short-lived thread queues it once the driver lets go.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda num, _: threading.Thread(target=agent.request_leave, name="leave-request",
                                                           args=(signal.Signals(num).name,), daemon=True).start())
    page = None
    if args.http is not None:
        from p2pgen.agent.statuspage import StatusPage
        try:
            page = StatusPage(args.listen, secret, args.job, args.http_bind, args.http)
        except OSError as e:
            print(f"p2pgen join: cannot serve the status page on {args.http_bind}:{args.http}: {e.strerror}; "
                  "choose another --http port", file=sys.stderr)
            return 2
        page.start()
        print(f"status page: {page.url}", file=sys.stderr, flush=True)
    try:
        return agent.run()
    except JoinError as e:
        print(f"p2pgen join: {e}", file=sys.stderr)
        return 2
    finally:
        if page is not None:
            page.stop()


# --- show / history ----------------------------------------------------------------------------------

def _client(args: argparse.Namespace):
    from p2pgen.agent.client import AgentClient
    return AgentClient(args.peer, read_secret_file(args.secret_file))


def _fetch(args: argparse.Namespace, method: str) -> Any:
    from p2pgen.errors import P2PGenError
    try:
        with _client(args) as client:
            return getattr(client, method)()
    except (OSError, P2PGenError, SecretError) as e:
        print(f"p2pgen {method}: cannot ask the agent at {args.peer}: {e}", file=sys.stderr)
        return None


def cmd_show(args: argparse.Namespace) -> int:
    if args.watch:
        if args.json:
            print("p2pgen show: --watch draws for people; use --json without --watch (or poll it)", file=sys.stderr)
            return 2
        from p2pgen.agent.watch import watch
        try:
            secret = read_secret_file(args.secret_file)
        except SecretError as e:
            print(f"p2pgen show: {e}", file=sys.stderr)
            return 2
        from p2pgen.agent.client import AgentClient
        return watch(lambda: AgentClient(args.peer, secret), format_show)
    shown = _fetch(args, "show")
    if shown is None:
        return 1
    print(json.dumps(shown, indent=2, sort_keys=True) if args.json else format_show(shown))
    return 0


def cmd_history(args: argparse.Namespace) -> int:
    history = _fetch(args, "history")
    if history is None:
        return 1
    if args.plot:
        return _plot_history(history, args.plot)
    print(json.dumps(history, indent=2, sort_keys=True) if args.json else format_history(history))
    return 0


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S.%f")[:-3] if ts else "-"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def format_drain(draining: dict[str, Any]) -> str:
    """`draining, leaves by HH:MM:SS (why)`: a drain as `show` prints it."""
    by = time.strftime("%H:%M:%S", time.localtime(draining["leaves_by"]))
    stop = ", the application stops at its next step boundary" if draining.get("stop_at_boundary") else ""
    return f"draining, leaves by {by} ({draining['why']}{stop})"


def format_show(shown: dict[str, Any]) -> str:
    state, raft, agent = shown["state"], shown["raft"], shown["agent"]
    epoch = f"epoch {raft['epoch']}, " if raft.get("epoch") else ""
    lines = [f"job {state['job']} · Raft {epoch}term {raft['term']}, index {raft['index']}, leader "
             f"{raft['leader_agent'] or 'none heard'} · {len(raft['voters'])} voter(s), "
             f"{len(raft['nonvoters'])} non-voting member(s)",
             "voters:     " + ", ".join(f"{v['agent']} ({v['node'].rpartition('/')[2]})" for v in raft["voters"]),
             "non-voting: " + (", ".join(raft["nonvoters"]) or "none"),
             f"this agent: {agent['addr']} as {'voter ' + raft['self'] if raft['voter'] else 'a non-voting member'}"
             + (f"; waiting: {agent['waiting']}" if agent.get("waiting") else "")
             + (f"; {format_drain(agent['draining'])}" if agent.get("draining") else "")]
    refused = format_refusals(agent.get("refusals", {}))
    if refused:
        lines.append("refused:    " + refused)
    cert = state["active"]
    if cert is None:
        lines.append("no active generation yet")
    else:
        lines += [
            f"generation {cert['generation']} (parent {cert['parent']}) active since {_when(cert['activated_at'])}, "
            f"certified at Raft term {cert['raft_term']} index {cert['raft_index']}",
            f"reason:   {cert['reason']}",
            f"frontier: revision {cert['frontier']['revision']}, digest {cert['frontier']['digest'] or '<empty>'}; "
            f"owners {', '.join(cert['owners'])} (ownership v{cert['ownership_version']}); "
            f"collective seq frontier {cert['collective_seq_frontier']}",
            f"state:    epoch {cert.get('state_epoch', 1)}, from {cert.get('frontier_source', 'members')}; "
            f"if it would regress: wait {state['rules']['regress_wait']:g} s, then "
            f"{'allow' if state['rules']['allow_fresh_start'] else 'refuse'} a fresh start from revision 0",
        ]
        if cert.get("recovery"):
            lines.append(f"RECOVERY: {cert['recovery']}")
        if cert.get("reformed"):
            lines.append(f"RE-FORMED: {cert['reformed']}")
        quiescence = {q["peer_id"]: q["quiescence"] for q in cert["quiescence"]}
        revisions = {r["peer_id"]: r["revision"] for r in cert["revisions"]}
        pulled = {p["peer_id"]: "checkpoint" if p.get("checkpoint") else "/".join(p["sources"]) for p in cert["pulled"]}
        zoned = any(m.get("zone") for m in cert["members"])
        rows = [["rank", "peer", "incarnation", f"quiescence(g{cert['parent']})", "revision", "pulled from", "agent"]
                + (["zone"] if zoned else [])]
        rows += [[m["rank"], m["peer_id"], m["incarnation"], quiescence[m["peer_id"]], revisions[m["peer_id"]],
                  pulled.get(m["peer_id"], "-"), m["addrs"].get("agent", "-")]
                 + ([m.get("zone") or "-"] if zoned else [])
                 for m in cert["members"]]
        lines += ["", _table(rows), ""]
        if cert.get("topology") or state.get("links"):
            lines += [*format_topology(cert, state.get("links", [])), ""]
        for d in cert["departed"]:
            lines.append(f"departed: {d['peer_id']}#{d['incarnation']}: {d['reason']}")
        if cert["divergence"]:
            lines.append("DIVERGENCE: " + ", ".join(f"{d['peer_id']} held {d['digest']}" for d in cert["divergence"]))
        lines.append(f"why generation {cert['parent']} was safe to retire: {cert['retired_safely']}")
        if cert.get("ownership"):
            lines += ["", *format_ownership(cert, state.get("layout", []))]
    pending = state["pending"]
    if pending:
        members = " ".join(f"{m['peer_id']}#{m['incarnation']}" for m in pending["members"])
        lines.append(f"pending:  generation {pending['generation']} [{members}] ready: "
                     f"{', '.join(pending['ready']) or 'none'} — {pending['reason']}")
        if pending.get("hold"):
            lines.append(format_hold(pending["hold"]))
    return "\n".join(lines)


def format_topology(cert: dict[str, Any], links: list[dict[str, Any]]) -> list[str]:
    """Why the ranks are in this order (the certificate's topology: groups, slow crossings, the all_reduce path)
    and the rates measured between the members' hosts (Mbit/s, the faster direction), as a matrix."""
    topology, lines = cert.get("topology"), []
    if topology:
        groups = "; ".join(f"{g['name']}: {' '.join(g['members'])}" for g in topology["groups"])
        lines += [f"rank order ({topology['source']}): {topology['reason']}",
                  f"groups:   {groups}; all_reduce {'hierarchical' if topology['hierarchical'] else 'ring'}"]
    hosts = sorted({_host(m) for m in cert["members"]} - {""})
    rates = {(r["from"], r["to"]): r["mbps"] for r in links if r["from"] in hosts and r["to"] in hosts}
    if rates:
        rows = [["Mbit/s", *hosts]]
        for a in hosts:
            rows.append([a] + ["-" if a == b else _mbps(rate(rates, a, b)) for b in hosts])
        lines += ["measured links:", _table(rows)]
    return lines


def _host(member: dict[str, Any]) -> str:
    addr = member["addrs"].get("data") or member["addrs"].get("agent") or ""
    return addr.rpartition(":")[0].strip("[]")


def _mbps(rate: float | None) -> str:
    return "?" if rate is None else f"{rate:.0f}"


def format_refusals(refusals: dict[str, dict[str, int]]) -> str:
    """What this agent's listeners refused, by reason (only reasons seen), e.g.
    "rpc auth_failed=2 truncated=1; heartbeat forged=5"; empty when nothing was refused."""
    parts = []
    for listener, counts in sorted(refusals.items()):
        seen = " ".join(f"{reason}={n}" for reason, n in sorted(counts.items()) if n)
        if seen:
            parts.append(f"{listener} {seen}")
    return "; ".join(parts)


def format_ownership(cert: dict[str, Any], layout: list[dict[str, Any]]) -> list[str]:
    """The ownership map of the sharded objects (object, shard, owners, bytes), what moved at the last change
    (the shards copied or rebuilt before this generation activated) and each object's manifest record."""
    from p2pgen.core.ownership import Partition
    parts = {p["object_id"]: Partition(p["object_id"], p["length"], p["shards"], p["itemsize"], p["r"])
             for p in layout}
    rows = [["object", "shard", "owners", "bytes"]]
    per_member: dict[str, int] = {}
    for e in cert["ownership"]:
        part = parts.get(e["object_id"])
        nbytes = part.shard_nbytes(e["shard"]) if part else 0
        rows.append([e["object_id"], e["shard"], ", ".join(e["owners"]), nbytes])
        for o in e["owners"]:
            per_member[o] = per_member.get(o, 0) + nbytes
    lines = [f"sharded objects (ownership v{cert['ownership_version']}):", _table(rows),
             "bytes owned per member: " + ", ".join(f"{m} {b}" for m, b in sorted(per_member.items()))]
    moved = cert.get("moved", [])
    total = sum(m["nbytes"] for m in moved)
    lines.append(f"moved at the last change (generation {cert['generation']}): {len(moved)} shard(s), {total} bytes"
                 + ("" if moved else " (nothing changed owner)"))
    if moved:
        rows = [["object", "shard", "to", "bytes", "from"]]
        rows += [[m["object_id"], m["shard"], m["to"], m["nbytes"], "/".join(m["sources"]) or "rebuilt"]
                 for m in moved]
        lines.append(_table(rows))
    for rec in cert.get("objects", []):
        lines.append(f"object {rec['object_id']}: revision {rec['application_revision']}, digest "
                     f"{rec['digest'] or '<rebuilt>'}, partition {rec['new_partition_descriptor']}, "
                     f"reconstruction source {rec['reconstruction_source']}")
    return lines


def format_hold(hold: dict[str, Any], now: float | None = None) -> str:
    """The loud line `show` prints for a proposal held because its frontier would regress."""
    now = time.time() if now is None else now
    left = hold["until"] - now
    when = f"{left:.0f} s left" if left > 0 else f"over since {_when(hold['until'])}: falls back when a member asks"
    return (f"HELD:     certified revision {hold['certified']} is missing; best available revision "
            f"{hold['best']['revision']}; waiting since {_when(hold['since'])} ({when}). {hold['reason']}")


def format_history(history: list[dict[str, Any]]) -> str:
    if not history:
        return "no generation yet"
    rows = [["gen", "outcome", "at", "members", "reason"]]
    rows += [[h["generation"], h["outcome"], _when(h["at"]),
              " ".join(f"{m['peer_id']}#{m['incarnation']}" for m in h["members"]), h["reason"]] for h in history]
    return _table(rows)


# --- the local demo ------------------------------------------------------------------------------------

def run_local_demo(args: argparse.Namespace) -> int:
    from p2pgen.agent.local import LocalJob
    n = args.local
    if not 0 < n <= 64 or args.base_port + 5 * n >= 32768:
        print("p2pgen join --local: N must be 1..64 and every port below 32768", file=sys.stderr)
        return 2
    try:
        state = state_config_from_args(args)
        encrypt = _encrypt(args)
        detector = config_from_args(args)
    except ValueError as e:
        print(f"p2pgen join --local: {e}", file=sys.stderr)
        return 2
    agent_args = [*state_flags(state), *detector_flags(detector), f"--max-restarts={args.max_restarts}",
                  f"--attach-grace={args.attach_grace}",
                  f"--standby={args.standby}"] + (["--encrypt"] if encrypt else [])
    job = LocalJob(n, args.job, args.base_port, agent_args, _command(args), args.secret_file,
                   chaos=args.chaos, seed=args.chaos_seed, steps=args.steps, step_delay=_demo_step_delay(args),
                   http=(args.http, args.http_bind) if args.http is not None else None)
    return job.run()


def _encrypt(args: argparse.Namespace) -> bool:
    """--encrypt, else $P2PGEN_ENCRYPT (ValueError on a value other than 0 or 1)."""
    from p2pgen.transport import seal

    return True if args.encrypt else seal.from_env(os.environ)


def _demo_step_delay(args: argparse.Namespace) -> float | None:
    if args.step_delay is not None:
        if args.step_delay < 0:
            raise SystemExit("p2pgen join --local: --step-delay must be >= 0 seconds")
        return args.step_delay
    return DEMO_STEP_DELAY_S if args.chaos and args.steps is not None and "P2PGEN_STEP_DELAY" not in os.environ \
        else None


def _plot_history(history: list[dict[str, Any]], path: str) -> int:
    try:
        from p2pgen.agent.historyplot import plot_history
    except ImportError as e:
        print(f"p2pgen history --plot needs matplotlib ({e}): pip install -e '.[sim]'", file=sys.stderr)
        return 2
    try:
        plot_history(history, path)
    except (ValueError, OSError) as e:
        print(f"p2pgen history --plot: {e}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0
