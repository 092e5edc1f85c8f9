"""Test doubles that ship with the runtime, for testing an application or a collective backend against p2pgen.

- `cluster`     N data-plane members in one process, on real loopback sockets (`LocalCluster`);
- `conformance` the suite every collective `Backend` must pass;
- `fake_nccl`   a fake `cupy.cuda.nccl` and CUDA device on host memory;
- `ports`       a Transport on a free port below the ephemeral range.
The lab's rigs (agent processes, emulated hosts, fault harnesses) live in `p2pgen_lab.rigs`. Nothing is imported
here: import the module you use.
"""
