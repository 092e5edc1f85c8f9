"""`with step:` discards a step on a generation change even when a library re-raised it as its own error
(torch's DDP reducer turns a failed bucket all-reduce into a RuntimeError carrying the text only), and
only then: any other exception passes unchanged. No processes: a Step over a stand-in peer and backend."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from p2pgen import peer as peer_module
from p2pgen.errors import GenerationChanged
from p2pgen.peer import Step


class Recorder:
    """A library that records the p2pgen errors its operations raised (as p2pgen.torch's groups do)."""

    def __init__(self) -> None:
        self.errors: list[BaseException] = []

    def mark(self) -> int:
        return len(self.errors)

    def unwrap(self, error: BaseException, mark: int) -> BaseException | None:
        return self.errors[-1] if isinstance(error, RuntimeError) and len(self.errors) > mark else None


@pytest.fixture
def library(monkeypatch):
    recorder = Recorder()
    monkeypatch.setattr(peer_module, "_wrapped_errors", [])
    peer_module.recognize_wrapped_errors(recorder)
    peer_module.recognize_wrapped_errors(recorder)          # once is enough
    assert peer_module._wrapped_errors == [recorder]
    return recorder


def a_step() -> Step:
    events: list[Any] = []
    peer = SimpleNamespace(state=SimpleNamespace(revision=7),
                           _trace=SimpleNamespace(record=lambda event, **f: events.append((event, f))))
    step = Step(peer, SimpleNamespace(generation=3, rank=0, world=2))
    step.events = events
    return step


def test_a_wrapped_generation_change_discards_the_step(library):
    step = a_step()
    with step:
        library.errors.append(GenerationChanged("generation 3 was retired"))
        raise RuntimeError("Detected an error in the comm hook: generation 3 was retired")
    assert isinstance(step.discarded, GenerationChanged) and not step.committed
    assert step.events == [("discard", {"generation": 3, "revision": 7, "reason": "generation 3 was retired"})]


def test_a_runtime_error_with_no_failed_operation_in_this_step_passes(library):
    library.errors.append(GenerationChanged("an older step's failure"))     # before this step started
    step = a_step()
    with pytest.raises(RuntimeError, match="a bug in the model"):
        with step:
            raise RuntimeError("a bug in the model")
    assert step.discarded is None


def test_a_wrapped_error_that_is_no_generation_change_passes_unchanged(library):
    step = a_step()
    with pytest.raises(RuntimeError, match="bad dtype"):
        with step:
            library.errors.append(TypeError("all_reduce: complex32 is not supported"))
            raise RuntimeError("bad dtype inside the reducer")
    assert step.discarded is None
