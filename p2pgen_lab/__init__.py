"""The lab: benchmarks, the chaos and stress harnesses, the churn simulator and the rigs they run on.

Layout: `bench` (`p2pgen bench ...`), `chaos` (`p2pgen chaos`), `stress` (`p2pgen stress`, `p2pgen check-traces`),
`simulator` (`p2pgen sim`), and `rigs`: the equipment they and the integration tests share (agent processes,
emulated hosts, channel fault cells, torch's suite as a referee, misbehaving and out-of-process peers).
The commands reach `p2pgen`'s command line through the `p2pgen.commands` entry point group (pyproject.toml).
Invariant: the lab imports the runtime (`p2pgen`), never the other way round (tests/test_imports.py).
"""
