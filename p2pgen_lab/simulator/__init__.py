"""Churn simulator: a discrete-event model of a cluster under failures, judged by p2pgen.detect.

The code of `p2pgen sim`; its results (tables, plots, the make script) live in the repository's `sims/`.

Layers: `model` (Scenario: every assumption) and `costs` (measured or assumed recovery times) <- `engine`
(`simulate`, deterministic under a seed) <- `tables` (the published churn study's sweeps, then p2pgen's)
<- `report` (text/JSON) <- `plots`
(matplotlib) <- `cli` (`p2pgen sim`). Invariant: detection inside the simulation is decided by
`p2pgen.detect.suspects`, the function the agent runs, never by a copy of it.
Nothing is imported here, so that `p2pgen --help` does not load numpy: import `p2pgen_lab.simulator.engine` etc.
"""
