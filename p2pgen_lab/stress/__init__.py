"""`p2pgen stress`: the churn test in the spirit of PCCL's stress test (docs/benchmarks/stress.md).

Layout, bottom up:
- `progress`  the file protocol between a training application and the harness: committed steps
              reported, one stop revision asked (the Peer does both for every application);
- `plan`      the seeded fault plan: which action next, on whom, under the minority rule (pure);
- `verdict`   stall, recovery, regressions, digest checks and pass/fail from what a run left (pure);
- `harness`   one run on real agent processes;
- `cli`       `p2pgen stress` and `p2pgen check-traces` (the Raft checker, `p2pgen.raft.checker`).
Invariant of the package: a run passes only if the Raft checker found no violation in the agents'
traces (and had traces to compare), every fault was followed by a committed step within 10 s, and
every live member ended at one revision with one digest.
"""
