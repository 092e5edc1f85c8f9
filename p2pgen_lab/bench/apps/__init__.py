"""Applications that `p2pgen bench recovery` runs under real agents (`python -m p2pgen_lab.bench.apps.<name>`).

- `steploop`  a small numpy model in the step loop, under the p2pgen policy or restart-all (torchrun-like).
- `noop`      a no-op model that times `peer.steps()` against bare all-reduces in one generation.
"""
