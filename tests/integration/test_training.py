"""Integration: the step loop on real processes ends at the serial reference through kills and a join.

Four members run the exact integer mini-training of `apps/exact_train.py` under their agents. One is
killed in the middle of a step, one between its all-reduce and its commit; a fifth peer joins. Every
final state must be bit-identical and equal to the single-process serial reference (I5), and the traces
must show that no collective of a generation ran before that generation's certificate, which exists
only once every member reported synced (I4).
"""

from __future__ import annotations

import glob
import json
import os
import sys
from pathlib import Path

import pytest

from p2pgen_lab.rigs.agents import free_control_ports
from tests.integration.apps.exact_train import reference

pytestmark = pytest.mark.timeout(180)

APP = [sys.executable, str(Path(__file__).parent / "apps" / "exact_train.py")]
STEPS = 120     # long enough (0.05 s a step) for both killed peers and the joiner to be back before the end


def read_traces(trace_dir: Path) -> dict[str, list[dict]]:
    """Every complete line of every trace: a live writer's last line may be half written (read while the
    peers run), and is left for the next read."""
    traces = {}
    for path in sorted(trace_dir.glob("*.jsonl")):
        complete = path.read_text().rpartition("\n")[0]
        traces[path.stem] = [json.loads(line) for line in complete.splitlines() if line.strip()]
    return traces


def test_training_survives_kills_and_a_join_and_equals_the_serial_history(cluster, tmp_path, monkeypatch):
    markers, summaries, traces = tmp_path / "markers", tmp_path / "summaries", tmp_path / "traces"
    for d in (markers, summaries, traces):
        d.mkdir()
    monkeypatch.setenv("EXACT_FAULTS", "p1:mid_step:8,p2:after_allreduce:16")
    monkeypatch.setenv("EXACT_MARKERS", str(markers))
    monkeypatch.setenv("EXACT_STEPS", str(STEPS))
    monkeypatch.setenv("EXACT_STEP_DELAY", "0.05")
    monkeypatch.setenv("P2PGEN_SUMMARY_DIR", str(summaries))
    monkeypatch.setenv("P2PGEN_TRACE_DIR", str(traces))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parents[2]),
                                                      os.environ.get("PYTHONPATH", "")]))

    ports = free_control_ports(5)
    addrs = [f"127.0.0.1:{p}" for p in ports]
    members = addrs[:4]
    for i, addr in enumerate(members):
        cluster.start(f"p{i}", addr, [a for a in members if a != addr], command=APP,
                      extra=("--min-members=4", "--attach-grace=60"))
    cluster.wait_until(lambda: len(list(markers.iterdir())) >= 1, 90, "the first fault firing")
    cluster.start("p4", addrs[4], [members[3]], command=APP, extra=("--attach-grace=60",))
    cluster.wait_until(lambda: len(list(markers.iterdir())) == 2, 90, "both faults firing")

    for agent in list(cluster.agents.values()):
        cluster.wait_until(lambda: not agent.alive(), 120, f"{agent.peer_id} finishing")
        assert agent.proc.returncode == 0, cluster.logs()

    # every live member ends bit-identical and equal to the serial reference (integer arithmetic: exact)
    finals = [json.loads(Path(p).read_text()) for p in glob.glob(str(summaries / "*.json"))]
    assert sorted(f["peer"] for f in finals) == ["p0", "p1", "p2", "p3", "p4"]
    expected = reference(STEPS).tolist()
    for f in finals:
        assert f["revision"] == STEPS and f["w"] == expected, f
    assert len({f["digest"] for f in finals}) == 1

    # the killed peers came back as new incarnations, the joiner pulled, and steps were discarded
    by_peer = {f["peer"]: f for f in finals}
    assert by_peer["p1"]["incarnation"] > 1 and by_peer["p2"]["incarnation"] > 1
    assert_trace_invariants(read_traces(traces))


def assert_trace_invariants(traces: dict[str, list[dict]]) -> None:
    """I4 from the recorded traces: within each process, every collective of generation G comes after
    the process saw G's certificate; every pull named by a certificate was followed by an accepted
    `synced` of that puller with the frontier digest; and nobody acted on a generation without it.

    A `synced` whose answer was lost (`submit_failed`: the agent's Raft node stopped while it waited) may
    still have committed, as any Raft client's command may; it counts only if the puller then found itself
    active in that generation, which the machine allows only after its Synced committed."""
    activations: dict[int, dict] = {}
    synced: dict[tuple[int, str, int], dict] = {}
    unanswered: set[tuple[int, str, int]] = set()
    for events in traces.values():
        seen_active: set[int] = set()
        for e in events:
            key = (e.get("generation"), e["peer"], e["incarnation"])
            if e["event"] == "submit_failed" and e["command"] == "Synced":
                unanswered.add(key)
            if e["event"] == "active":
                seen_active.add(e["generation"])
                activations[e["generation"]] = e
                if key in unanswered:
                    synced.setdefault(key, e)
            elif e["event"] == "collective":
                assert e["generation"] in seen_active, f"collective before its certificate: {e}"
            elif e["event"] == "synced" and e["ok"]:
                synced[(e["generation"], e["peer"], e["incarnation"])] = e
    assert activations, "no generation was ever activated"
    pulls = [e for events in traces.values() for e in events if e["event"] == "pull"]
    assert pulls, "nobody had to catch up: the faults did not exercise catch-up"
    for pull in pulls:
        g = pull["generation"]
        if g in activations:
            assert (g, pull["peer"], pull["incarnation"]) in synced, f"{pull} activated without its synced"
