"""`p2pgen bench <what>`: one sub-command per benchmark. Add one with another `_add_<what>` below.

Heavy imports (numpy, torch) stay inside the handlers so that `p2pgen --help` stays instant.
"""

from __future__ import annotations

import argparse
import sys

from p2pgen_lab.bench.allreduce import ROUNDS
from p2pgen_lab.rigs.netns import add_arguments as add_cluster_arguments


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks, side by side with their baselines")
    sub = bench.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    _add_allreduce(sub)
    _add_topology(sub)
    _add_recovery(sub)
    _add_channel(sub)
    _add_survive(sub)
    _add_torch_suite(sub)
    _add_scale(sub)
    _add_diloco(sub)


def _add_allreduce(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("allreduce", help="all_reduce: p2pgen vs torch gloo (nccl-tests style table)")
    p.add_argument("--world", type=int, default=4, help="processes on this machine (default 4)")
    p.add_argument("--sizes", nargs="+", default=["8", "4K", "64K", "1M", "16M", "64M"],
                   help="buffer sizes in bytes, with K/M/G suffixes (default: 8 4K 64K 1M 16M 64M)")
    p.add_argument("--iters", type=int, default=0, help="timed iterations per size (default: by size)")
    p.add_argument("--chunk", default="1M", help="p2pgen frame payload size (default 1M)")
    p.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved rounds per size; the table gives the "
                                                             f"median (default {ROUNDS})")
    p.add_argument("--no-gloo", action="store_true", help="skip the torch gloo baseline")
    p.add_argument("--no-shm", action="store_true", help="p2pgen without shared memory (P2PGEN_SHM=0): the TCP ring "
                                                        "at every size, as between hosts")
    p.add_argument("--encrypt", action="store_true", help="also time p2pgen with sealed links (join --encrypt) in the "
                                                         "same interleaved rounds: the sealed/plain time ratio and "
                                                         "the per-core AES-256-GCM rate (use with --no-shm)")
    p.add_argument("--compress", choices=("bf16", "int8"), help="also time p2pgen's compressed all_reduce (int8 with "
                                                               "per-block scales, or bf16) in the same rounds: "
                                                               "time and bytes sent against plain (use with "
                                                               "--no-shm or --hosts)")
    p.add_argument("--idle", type=float, default=0.0, metavar="S",
                   help="every rank sleeps S seconds before each timed call (not timed), so the links idle "
                        "between collectives as between DiLoCo's outer steps (use with --iters)")
    add_cluster_arguments(p, "one rank of each backend")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--plot", metavar="FILE", help="also draw bandwidth and time against size, beside gloo, to FILE "
                                                  "(.png, .svg, .pdf; matplotlib from the sim extra)")
    p.set_defaults(func=_run_allreduce)


def _add_topology(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("topology", help="all_reduce on a zoned emulated cluster: the ring in join order beside the "
                                        "ring in the measured order and the hierarchical all_reduce")
    p.add_argument("--sizes", nargs="+", default=["4M", "16M"], help="buffer sizes (default: 4M 16M)")
    p.add_argument("--iters", type=int, default=0, help="timed calls per round (default: by size)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds per size (default 5)")
    p.add_argument("--chunk", default="1M", help="frame payload size (default 1M)")
    p.add_argument("--hosts", type=int, default=4, metavar="N", help="emulated hosts, as root (default 4)")
    p.add_argument("--topology", metavar="FILE",
                   help="zones and rates (the format of bench allreduce --topology; default: two zones alternating, "
                        "h0 h2 ... and h1 h3 ..., 10gbit inside, 200mbit between)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the report")
    p.set_defaults(func=_run_topology)


def _run_topology(args: argparse.Namespace) -> int:
    from p2pgen_lab.bench import allreduce, topology
    from p2pgen_lab.rigs.netns import ClusterError, EmulatedCluster, TopologyError, from_arguments

    try:
        sizes = [allreduce.parse_size(s) for s in args.sizes]
        chunk = allreduce.parse_size(args.chunk)
    except ValueError as e:
        raise SystemExit(f"p2pgen bench topology: {e}") from None
    if args.hosts < 4 or args.rounds < 1 or args.iters < 0:
        raise SystemExit("p2pgen bench topology: --hosts must be >= 4 (two zones of two), --rounds >= 1, --iters >= 0")
    try:
        hosts = from_arguments(args.hosts, topology=args.topology)
    except (ClusterError, TopologyError) as e:
        raise SystemExit(f"p2pgen bench topology: {e}") from None
    if not args.topology:
        hosts = EmulatedCluster(args.hosts, topology.default_shape(args.hosts))
    try:
        hosts.create()
        result = topology.run(hosts, sizes, iters=args.iters, rounds=args.rounds, chunk_bytes=chunk)
    except ValueError as e:
        raise SystemExit(f"p2pgen bench topology: {e}") from None
    finally:
        hosts.remove()
    print(topology.to_json(result) if args.json else topology.format_report(result, hosts.describe()))
    return 0


def _cluster(command: str, args: argparse.Namespace):
    """The emulated cluster of --hosts/--rate/--topology (not yet created), or None; bad options exit 2."""
    from p2pgen_lab.rigs.netns import ClusterError, TopologyError, from_arguments

    try:
        return from_arguments(args.hosts, args.rate, args.topology)
    except (ClusterError, TopologyError) as e:
        raise SystemExit(f"p2pgen bench {command}: {e}") from None


def _run_allreduce(args: argparse.Namespace) -> int:
    from p2pgen_lab.bench import allreduce

    try:
        sizes = [allreduce.parse_size(s) for s in args.sizes]
        chunk = allreduce.parse_size(args.chunk)
    except ValueError as e:
        raise SystemExit(f"p2pgen bench allreduce: {e}") from None
    if args.world < 1 or args.rounds < 1 or not args.idle >= 0:
        raise SystemExit("p2pgen bench allreduce: --world and --rounds must be at least 1, --idle >= 0")
    if args.compress and args.encrypt:
        raise SystemExit("p2pgen bench allreduce: --compress and --encrypt: measure one at a time")
    plots = _plots_module("allreduce") if args.plot else None
    hosts = _cluster("allreduce", args)
    world = len(hosts.names) if hosts else args.world
    try:
        if hosts:
            hosts.create()
        rows = allreduce.run(world, sizes, iters=args.iters, chunk_bytes=chunk, gloo=not args.no_gloo,
                             shm=not args.no_shm, rounds=args.rounds, hosts=hosts, encrypt=args.encrypt,
                             compress=args.compress, idle=args.idle)
    finally:
        if hosts:
            hosts.remove()
    rates = allreduce.seal_throughput(chunk) if args.encrypt else None
    if args.json:
        print(allreduce.to_json(world, rows, rates))
    else:
        link = hosts.topology.intra if hosts and hosts.topology and hosts.topology.is_uniform() else None
        print(allreduce.format_table(world, rows, where=hosts.describe() if hosts else "127.0.0.1", link_bits=link,
                                     seal_rates=rates))
    if plots is not None:
        plots.plot_allreduce(world, rows, allreduce.busbw, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _plots_module(what: str):
    """p2pgen_lab.bench.plots, or a clear exit before any measuring when matplotlib is missing."""
    try:
        from p2pgen_lab.bench import plots
    except ImportError as e:
        raise SystemExit(f"p2pgen bench {what} --plot needs matplotlib ({e}): pip install -e '.[sim]'") from None
    return plots


def _add_recovery(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("recovery", help="fault and join recovery on real agent processes (membership, step loop "
                                        "beside torchft, torchrun and restart-all, heal with and without a warm "
                                        "standby), catch-up vs raw TCP, per-step overhead")
    p.add_argument("--trials", type=int, help="membership trials per fault kind (default 4; --quick: 1)")
    p.add_argument("--steploop-trials", type=int, help="step-loop trials of the three faults, per peer and round "
                                                       "(default 1 x 2 rounds; --quick: 1 x 1 round)")
    p.add_argument("--peers", nargs="+", choices=("p2pgen", "torchft", "torchrun", "restart-all"),
                   help="step-loop peers (default: all; one that is not installed is skipped with the reason)")
    p.add_argument("--checkpoint-every", type=int,
                   help="torchrun and restart-all: steps between checkpoints (default 20); faults land mid-interval")
    p.add_argument("--detect-timeout", type=float, default=1.0, help="agents' fixed detection timeout (default 1.0 s)")
    p.add_argument("--quick", action="store_true", help="a short run of every section (a few minutes: the step loop "
                                                        "alone takes about 3 with every peer)")
    p.add_argument("--only", action="append", metavar="SECTION",
                   choices=("membership", "steploop", "heal", "catchup", "overhead", "drain"),
                   help="run only this section (repeatable): membership, steploop, heal, catchup, overhead, drain")
    add_cluster_arguments(p, "each agent of the membership and step-loop sections (p2pgen and restart-all; at "
                             "least 4 hosts)")
    p.add_argument("--json", action="store_true", help="print JSON (the format `p2pgen sim --recovery-json` reads)")
    p.add_argument("--out", help="also write the JSON to this file")
    p.add_argument("--plot", metavar="FILE", help="also draw the step-loop table beside restart-all and the "
                                                  "membership times to FILE (matplotlib from the sim extra)")
    p.set_defaults(func=_run_recovery)


def _run_recovery(args: argparse.Namespace) -> int:
    import dataclasses

    from p2pgen_lab.bench import recovery

    given = {"trials": args.trials, "steploop_trials": args.steploop_trials, "checkpoint_every": args.checkpoint_every}
    if any(v is not None and v < 1 for v in given.values()) or args.detect_timeout <= 0:
        raise SystemExit("p2pgen bench recovery: --trials, --steploop-trials and --checkpoint-every must be >= 1, "
                         "--detect-timeout > 0")
    plan = recovery.Plan.quick() if args.quick else recovery.Plan()
    plan = dataclasses.replace(plan, **{k: v for k, v in given.items() if v is not None})
    if args.peers:
        plan = dataclasses.replace(plan, peers=tuple(p for p in recovery.STEPLOOP_PEERS if p in args.peers))
    sections = tuple(s for s in recovery.SECTIONS if not args.only or s in args.only)
    if args.hosts:
        if args.hosts < 4:
            raise SystemExit("p2pgen bench recovery: --hosts needs at least 4 hosts (3 members and a joiner)")
        skipped = [s for s in sections if s not in recovery.HOST_SECTIONS]
        if skipped:
            print(f"p2pgen bench recovery: on emulated hosts only {', '.join(recovery.HOST_SECTIONS)} run; "
                  f"skipped: {', '.join(skipped)}", file=sys.stderr)
        sections = tuple(s for s in sections if s in recovery.HOST_SECTIONS)
        plan = dataclasses.replace(plan, hosts=_cluster("recovery", args))
    if args.plot:
        _plots_module("recovery")
    return recovery.main(plan, args.detect_timeout, sections, args.json, args.out, args.plot)


def _add_channel(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("channel", help="exactly-once channels: losses and duplicates under faults (naive, "
                                       "batched, exactly_once) and the fault-free cost of dedup")
    p.add_argument("--injections", type=int, default=36,
                   help="faults injected per (fault, size, mode) cell (default 36: 216 per mode)")
    p.add_argument("--repeats", type=int, default=7, help="interleaved fault-free throughput runs (default 7)")
    p.add_argument("--sizes", nargs="+", type=int, default=[16, 65536],
                   help="message sizes in bytes, multiples of 8, at least 16 (default: 16 65536)")
    p.add_argument("--faults", nargs="+", default=["F1", "F2", "F3"], choices=["F1", "F2", "F3"],
                   help="F1 receiver SIGKILL + restart, F2 sender self-abort, F3 receiver SIGSTOP 100-800 ms")
    p.add_argument("--window", type=int, default=32, help="sender window (default 32)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the tables")
    p.add_argument("--out", help="also write the JSON to this file")
    p.set_defaults(func=_run_channel)


def _run_channel(args: argparse.Namespace) -> int:
    from p2pgen_lab.bench import channel

    if args.injections < 0 or args.repeats < 0 or args.window < 16:
        raise SystemExit("p2pgen bench channel: --injections and --repeats must be >= 0, --window >= 16")
    if any(s < 16 or s % 8 for s in args.sizes):
        raise SystemExit("p2pgen bench channel: --sizes must be multiples of 8, at least 16")
    return channel.main(args.injections, args.repeats, args.sizes, args.faults, args.window, args.json, args.out)


def _add_survive(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("survive", help="state that outlives its processes: local copy and checkpoint costs vs a "
                                       "pull; every application killed at once with a local copy, a checkpoint, "
                                       "or neither")
    p.add_argument("--state-mb", nargs="+", type=float, help="overhead: state sizes in MiB (default 16 256 1024; "
                                                             "--quick: 16)")
    p.add_argument("--overhead-seconds", type=float, help="overhead: seconds measured per run (default 12)")
    p.add_argument("--local-state-budget", type=float, help="overhead: the members' --local-state-budget with the "
                                                            "copy on (default 0.05)")
    p.add_argument("--sizes", nargs="+", type=float, help="copies: state sizes in MB (default 16 128; --quick: 16)")
    p.add_argument("--killall-mb", type=float, help="killall: state size in MB (default 64; --quick: 16)")
    p.add_argument("--trials", type=int, help="killall: kills per configuration (default 3; --quick: 1)")
    p.add_argument("--churn-seconds", type=float, help="churn: seconds of faults per configuration (default 240; "
                                                       "--quick: 40)")
    p.add_argument("--churn-members", type=int, help="churn: members (default 5)")
    p.add_argument("--seed", type=int, help="churn: seed of the fault schedule (default 1)")
    p.add_argument("--quick", action="store_true", help="a short run of every section")
    p.add_argument("--only", action="append", metavar="SECTION", choices=("overhead", "copies", "killall", "churn"),
                   help="run only this section (repeatable): overhead, copies, killall, churn")
    p.add_argument("--json", action="store_true", help="print JSON instead of the tables")
    p.add_argument("--out", help="also write the JSON to this file")
    p.set_defaults(func=_run_survive)


def _run_survive(args: argparse.Namespace) -> int:
    import dataclasses

    from p2pgen_lab.bench import survive

    sizes = tuple(args.sizes or ()) + tuple(args.state_mb or ())
    positive = (args.overhead_seconds, args.local_state_budget)
    if (args.trials is not None and args.trials < 1) or any(s <= 0 for s in sizes) or any(
            v is not None and v <= 0 for v in positive) or (
            args.killall_mb is not None and args.killall_mb <= 0) or (
            args.churn_seconds is not None and args.churn_seconds <= 0) or (
            args.churn_members is not None and args.churn_members < 3):
        raise SystemExit("p2pgen bench survive: --trials must be >= 1, --churn-members >= 3, --sizes, --state-mb, "
                         "--overhead-seconds, --local-state-budget, --killall-mb and --churn-seconds > 0")
    plan = survive.Plan.quick() if args.quick else survive.Plan()
    given = {"sizes_mb": tuple(args.sizes) if args.sizes else None, "killall_mb": args.killall_mb,
             "trials": args.trials, "churn_s": args.churn_seconds, "seed": args.seed,
             "churn_members": args.churn_members, "state_mb": tuple(args.state_mb) if args.state_mb else None,
             "overhead_s": args.overhead_seconds, "overhead_budget": args.local_state_budget}
    plan = dataclasses.replace(plan, **{k: v for k, v in given.items() if v is not None})
    sections = tuple(s for s in survive.SECTIONS if not args.only or s in args.only)
    return survive.main(plan, sections, args.json, args.out)


def _add_torch_suite(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("torch-suite", help="torch's own distributed_test.py against gloo and p2pgen, side by side")
    p.add_argument("names", nargs="*", help="tests to run (default: every test of the suite)")
    p.add_argument("--backends", default="gloo,p2pgen", help="comma-separated backends (default gloo,p2pgen)")
    p.add_argument("--world", type=int, default=2, help="processes per test (default 2)")
    p.add_argument("--timeout", type=int, default=120, help="seconds per test before it fails (default 120)")
    p.add_argument("--progress", action="store_true", help="one line per test on stderr")
    p.add_argument("--json", action="store_true", help="print every backend's per-test results as JSON")
    p.set_defaults(func=_run_torch_suite)


def _run_torch_suite(args: argparse.Namespace) -> int:
    import json

    from p2pgen_lab.bench import torch_suite

    backends = [b for b in args.backends.split(",") if b]
    unknown = [b for b in backends if b not in ("gloo", "p2pgen")]
    if unknown or args.world < 2:
        raise SystemExit("p2pgen bench torch-suite: --backends takes gloo and/or p2pgen, --world at least 2")
    results = {b: torch_suite.run_backend(b, args.world, args.names, args.timeout, args.progress) for b in backends}
    print(json.dumps(results, indent=1) if args.json else torch_suite.format_table(results, args.world))
    return 0


def _add_scale(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("scale", help="control plane at 4, 8, 16, 32 agents: formation, kill -> active, Raft entries "
                                     "per change, idle CPU per agent")
    p.add_argument("--agents", nargs="+", type=int, default=[4, 8, 16, 32], help="agent counts (default 4 8 16 32)")
    p.add_argument("--kills", type=int, default=3, help="application kills per count (median; default 3)")
    p.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU measurement (default 10)")
    p.add_argument("--json", action="store_true", help="print {rows: [...]} instead of the table")
    p.add_argument("--threads", action="store_true", help="also split the idle CPU by thread (needs py-spy)")
    p.set_defaults(func=_run_scale)


def _run_scale(args: argparse.Namespace) -> int:
    from p2pgen_lab.bench import scale

    if any(n < 2 for n in args.agents) or args.kills < 1 or args.idle <= 0:
        raise SystemExit("p2pgen bench scale: every --agents count must be >= 2, --kills >= 1, --idle > 0")
    return scale.main(args.agents, args.kills, args.idle, args.json, args.threads)


def _add_diloco(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("diloco", help="time to a target loss: DiLoCo vs synchronous training, on emulated hosts")
    p.add_argument("--hosts", type=int, default=4, metavar="N", help="emulated hosts, as root (default 4)")
    p.add_argument("--rate", default="100mbit", help="every link's rate (default 100mbit)")
    p.add_argument("--sync-every", type=int, nargs="+", default=[10, 50, 100], metavar="H",
                   help="DiLoCo's inner steps per outer step, one row each (default 10 50 100)")
    p.add_argument("--compress", nargs="*", default=[], choices=("bf16", "int8"),
                   help="also each H with the outer all-reduce compressed so")
    p.add_argument("--target-loss", type=float, default=0.0025, help="the loss to reach (default 0.0025)")
    p.add_argument("--max-seconds", type=float, default=150.0, help="a row's longest run (default 150)")
    p.add_argument("--only", nargs="+", default=None, metavar="LABEL",
                   help="run only the rows whose label contains one of these words (ddp, synchronous, H=50, "
                        "int8, ...); speed-ups are against the first row run")
    p.add_argument("--faults-every", type=float, default=0.0, metavar="S",
                   help="also: DiLoCo (the first H; p2pgen's, and torchft's when installed; --only picks "
                        "among them too) for --fault-seconds, fault-free and with a host killed every S "
                        "seconds (restarted after 1 s): the steps kept")
    p.add_argument("--fault-seconds", type=float, default=90.0)
    p.add_argument("--workdir", default=None, help="where the logs go (default: a temporary folder)")
    p.add_argument("--plot", metavar="FILE.png", help="also draw loss against wall time per configuration")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run_diloco)


def _run_diloco(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from p2pgen_lab.bench import diloco

    plots = _plots_module("diloco") if args.plot else None
    if args.hosts < 2 or any(h < 1 for h in args.sync_every) or args.max_seconds <= 0:
        raise SystemExit("p2pgen bench diloco: --hosts must be >= 2, --sync-every >= 1, --max-seconds > 0")
    hosts = _cluster("diloco", argparse.Namespace(hosts=args.hosts, rate=args.rate, topology=None))
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="p2pgen-diloco-"))
    skipped = diloco.torchft_skipped()
    rows = diloco.configs(args.sync_every, args.compress, torchft=skipped is None)
    fault_rows = diloco.fault_configs(args.sync_every[0], torchft=skipped is None) if args.faults_every else []
    if args.only:
        rows, fault_rows = ([r for r in chosen if any(w.lower() in r.label.lower() for w in args.only)]
                            for chosen in (rows, fault_rows))
    if skipped:
        print(skipped, file=sys.stderr)
    results, faults, torchft_faults = [], None, None
    try:
        hosts.create()
        for i, config in enumerate(rows):
            print(f"running {config.label} ...", file=sys.stderr)
            results.append(diloco.run_config(hosts, config, workdir / f"row{i}", args.target_loss,
                                             args.max_seconds))
        for config in fault_rows:
            print(f"running {config.label}, fault-free and faulty ...", file=sys.stderr)
            pair = tuple(diloco.run_config(hosts, config, workdir / f"{config.mode}-{name}", 0.0,
                                           args.fault_seconds, every)
                         for name, every in (("clean", 0.0), ("faults", args.faults_every)))
            if config.mode == "torchft":
                torchft_faults = pair
            else:
                faults = pair
    finally:
        hosts.remove()
    if plots is not None:
        plots.plot_diloco(results, args.target_loss, f"{args.hosts} hosts, every link {args.rate}", args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.json:
        print(diloco.to_json(results, faults, torchft_faults))
        return 0
    if results:
        print(diloco.format_results(results, args.target_loss, hosts.describe()))
    if faults:
        print()
        print(diloco.format_faults(*faults, args.faults_every, args.fault_seconds))
    if torchft_faults:
        print()
        print(diloco.format_torchft_faults(*torchft_faults, args.faults_every, args.fault_seconds))
    if skipped:
        print(skipped)
    print(f"logs: {workdir}", file=sys.stderr)
    return 0
