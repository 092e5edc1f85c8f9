"""torch's own distributed test suite as a referee: `DistributedTest._DistTestBase` from the torch wheel's
`torch/testing/_internal/distributed/distributed_test.py`, run against one backend.

Owns: the test class (`TestDistBackendWithSpawn`, torch's `TestDistBackend` driver combined with the test
base, as upstream's `test/distributed/test_distributed_spawn.py` does, which the wheel does not ship) and a
runner that records passed / failed / skipped per test as JSON (`python -m p2pgen_lab.rigs.torch_suite`).
`p2pgen bench torch-suite` runs it once per backend and prints the two side by side.

The environment fixes the backend before import, as torch's file reads it then: BACKEND (gloo, p2pgen),
WORLD_SIZE, and DISTRIBUTED_TESTS_DEFAULT_TIMEOUT (seconds per test). Every test starts WORLD_SIZE processes,
forked from the runner (as upstream's former test_distributed_fork.py did: a spawned process re-imports
torch and this 10,000-line test file, about 5 s of CPU per process, which would make a full run take hours
on a small machine); `P2PGEN_SUITE_START=spawn` spawns them instead, which imports this module again in each
process, so it stays importable on its own. The runner process never creates a process group, so a fork
copies no communicator or thread of p2pgen's.

Gates: torch's file decides at import which tests a backend runs, through `DistTestCases.backend_feature` and
through tests gated on the name "gloo". For BACKEND=p2pgen, p2pgen is admitted wherever gloo is: added to
every feature set that holds gloo (and to "plugin", torch's set of registered third-party backends), and the
file is executed with `BACKEND != "gloo"`, `BACKEND == "gloo"` and `require_backend_is_available({"gloo"})`
read as "gloo or p2pgen" (a text substitution of exactly these three forms, nothing else). So p2pgen is asked
to pass every test gloo runs, including the ones that check gloo-specific behaviour; the README lists the
exclusions with a reason each. For BACKEND=gloo the file is imported unchanged.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import time
import unittest
from pathlib import Path

GLOO_LIKE = ("gloo", "p2pgen")
_GATES = (('BACKEND != "gloo"', "BACKEND not in GLOO_LIKE"), ('BACKEND == "gloo"', "BACKEND in GLOO_LIKE"),
          ('require_backend_is_available({"gloo"})', 'require_backend_is_available({"gloo", "p2pgen"})'))
MODULE = "p2pgen_torch_distributed_test"


def _load_distributed_test():
    """torch's distributed_test module, with p2pgen admitted where gloo is when BACKEND=p2pgen."""
    from torch.testing._internal.common_distributed import DistTestCases

    backend = os.environ["BACKEND"]
    if backend != "p2pgen":
        from torch.testing._internal.distributed import distributed_test
        return distributed_test
    import p2pgen.torch  # noqa: F401  (registers the backend, here and in every spawned test process)

    for features in DistTestCases.backend_feature.values():
        if "gloo" in features:
            features.add("p2pgen")
    DistTestCases.backend_feature["plugin"].add("p2pgen")
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    spec = importlib.util.find_spec("torch.testing._internal.distributed.distributed_test")
    source = Path(spec.origin).read_text()
    for old, new in _GATES:
        if old not in source:
            raise RuntimeError(f"torch's distributed_test.py no longer contains {old!r}: update p2pgen's gates")
        source = source.replace(old, new)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(MODULE, loader=None))
    module.__file__ = spec.origin
    module.GLOO_LIKE = GLOO_LIKE
    sys.modules[MODULE] = module
    exec(compile(source, spec.origin, "exec", dont_inherit=True), module.__dict__)
    return module


_dt = _load_distributed_test()


class TestDistBackendWithSpawn(_dt.TestDistBackend, _dt.DistributedTest._DistTestBase):
    def setUp(self) -> None:
        super().setUp()
        if os.environ.get("P2PGEN_SUITE_START", "fork") == "spawn":
            self._spawn_processes()
        else:
            import torch.multiprocessing

            self._start_processes(torch.multiprocessing.get_context("fork").Process)


def test_names() -> list[str]:
    return sorted(n for n in dir(TestDistBackendWithSpawn) if n.startswith("test_"))


class _Recorder(unittest.TestResult):
    """{test name: {"status", "seconds", "detail"}} for every test run."""

    def __init__(self, progress: bool) -> None:
        super().__init__()
        self.results: dict[str, dict] = {}
        self._progress = progress
        self._started = 0.0

    def startTest(self, test: unittest.TestCase) -> None:
        super().startTest(test)
        self._started = time.monotonic()

    def _record(self, test: unittest.TestCase, status: str, detail: str = "") -> None:
        name = test.id().rsplit(".", 1)[-1]
        self.results[name] = {"status": status, "seconds": round(time.monotonic() - self._started, 2),
                              "detail": _reason(detail)}
        if self._progress:
            print(f"{len(self.results):4d} {status:7s} {self.results[name]['seconds']:6.1f}s {name}",
                  file=sys.stderr, flush=True)

    def addSuccess(self, test: unittest.TestCase) -> None:
        self._record(test, "passed")

    def addFailure(self, test: unittest.TestCase, err) -> None:
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test: unittest.TestCase, err) -> None:
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test: unittest.TestCase, err) -> None:
        self._record(test, "passed", "expected failure")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        self._record(test, "failed", "unexpected success")


def _reason(detail: str) -> str:
    """The line that says what went wrong: the last `SomeError: ...` line of a traceback, else the last line."""
    lines = [line.strip() for line in detail.strip().splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]*(Error|Exception|Timeout\w*)\b", line)]
    return (errors or lines or [""])[-1][:300]


def run(names: list[str], progress: bool = False) -> dict[str, dict]:
    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    recorder = _Recorder(progress)
    suite.run(recorder)
    return recorder.results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="tests to run (default: all)")
    parser.add_argument("--json", required=True, help="write {test: {status, seconds, detail}} here")
    parser.add_argument("--progress", action="store_true", help="one line per test on stderr")
    args = parser.parse_args(argv)
    known = set(test_names())
    unknown = [n for n in args.names if n not in known]
    if unknown:
        raise SystemExit(f"unknown test(s): {', '.join(unknown)}")
    results = run(args.names or sorted(known), progress=args.progress)
    Path(args.json).write_text(json.dumps(results, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
