"""Lab equipment shared by the harnesses, the benchmarks and the integration tests.

- `agents`         real `p2pgen join` processes on 127.0.0.1 or in emulated hosts, and their ports;
- `netns`          an emulated cluster: hosts as network namespaces, shaped links, cuts and partitions;
- `channels`       channel fault cells on real processes (`p2pgen bench channel`);
- `torch_suite`    torch's own distributed test suite as a referee (`p2pgen bench torch-suite`);
- `member_process` a data-plane member in its own process, for kill tests;
- `rogue`          a misbehaving peer that writes hand-made frames.
The runtime's own test doubles (in-process cluster, backend conformance suite, fake NCCL) stay in
`p2pgen.testing`. Nothing is imported here: import the module you use.
"""
