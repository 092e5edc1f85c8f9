"""`p2pgen chaos`: the membership-transition counterexample benchmark (docs/benchmarks/chaos.md).

Layout, bottom up:
- `model`     the exact integer mini-training: every parameter of every revision in closed form.
- `schedule`  seeded fault schedules (what to inject, where, into whom, at which revision).
- `policies`  the recovery policies as `p2pgen.peer.Peer` variants: certified, comm-only, restart-all.
- `app`       the training application (`python -m p2pgen_lab.chaos.app RUN_DIR`) with named injection points.
- `runner`    one schedule under one policy on real agent processes; collects the logs.
- `checker`   judges a run against the serial reference and names the semantic failure.
- `report`    the table (semantic failures first) and its JSON.
- `cli`       `p2pgen chaos`.
`--sharded` adds a sharded object to the mini-training and faults during repartition; the
checker then also judges every shard a member exposes against the shard of its revision.
Invariant of the package: a run passes only if every live member ends bit-identical and equal to one
legal serial history (shards included, in the sharded variant); speed is reported, never judged.
"""
