"""The Raft trace checker on hand-made traces: a clean job passes; each doctored trace fails exactly the
check it breaks, with a concrete example; cut and foreign lines are tolerated."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from p2pgen.raft.checker import CHECKS, activations, check, check_dir, load

pytestmark = pytest.mark.timeout(30)

NODES = {"p0": "127.0.0.1:20001/aa01", "p1": "127.0.0.1:20006/bb02", "p2": "127.0.0.1:20011/cc03"}
LOG = ([("register", "p0", 1), ("register", "p1", 1), ("register", "p2", 1), ("activate", 1, "p0 p1 p2", 0)]
       + [("ready", i) for i in range(40)]
       + [("register", "p1", 2), ("activate", 2, "p0 p2 p1", 12)])


def running_hashes(log: list[tuple]) -> list[str]:
    h, out = b"", []
    for i, entry in enumerate(log, 1):
        h = hashlib.sha256(h + json.dumps([i, 1, entry]).encode()).digest()
        out.append(h.hex())
    return out


def clean_traces() -> dict[str, list[dict]]:
    """Three agents that applied the whole log; p0 led term 1, p1 led term 2."""
    hashes = running_hashes(LOG)
    traces = {}
    for peer, node in NODES.items():
        host, port = node.split("/")[0].split(":")
        base = {"agent": f"{host}:{int(port) - 1}", "instance": node[-4:], "node": node}
        recs = [{"t": 1.0, "kind": "node", "voter": True, **base}]
        if peer in ("p0", "p1"):
            recs.append({"t": 2.0 + (peer == "p1"), "kind": "leader", "term": 1 + (peer == "p1"), **base})
        for i, entry in enumerate(LOG, 1):
            t = 10.0 + i / 10
            if entry[0] == "register":
                recs.append({"t": t, "kind": "register", "index": i, "peer_id": entry[1], "incarnation": entry[2],
                             **base})
            elif entry[0] == "activate":
                members = [[p, 2 if (p == "p1" and entry[1] == 2) else 1] for p in entry[2].split()]
                recs.append({"t": t, "kind": "activated", "index": i, "generation": entry[1], "members": members,
                             "revision": entry[3], "regressed_from": None, **base})
            if i % 16 == 0 or i == len(LOG):
                recs.append({"t": t, "kind": "applied", "index": i, "term": 1, "hash": hashes[i - 1], **base})
        traces[f"{peer}-{node[-4:]}"] = recs
    return traces


def write(tmp: Path, traces: dict[str, list[dict]], tail: dict[str, str] | None = None) -> Path:
    for name, recs in traces.items():
        text = "".join(json.dumps(r) + "\n" for r in recs) + (tail or {}).get(name, "")
        (tmp / f"{name}.jsonl").write_text(text)
    return tmp


def only_failing(result) -> list[str]:
    return [c for c in CHECKS if result.counts[c]]


def test_a_clean_trace_passes_every_check_and_says_how_much_it_compared(tmp_path):
    result = check_dir(write(tmp_path, clean_traces()))
    assert result.passed and only_failing(result) == []
    assert result.checked["indexes_compared"] == 3            # 16, 32 and the last index 46, each by 3 nodes
    assert result.checked["terms"] == 2 and result.checked["registrations"] == 4
    assert result.checked["generations"] == 2 and result.checked["processes"] == 3 and result.evidence
    assert "pass" in result.render() and result.to_json()["violations"] == dict.fromkeys(CHECKS, 0)


def test_an_empty_directory_passes_but_has_no_evidence(tmp_path):
    result = check_dir(tmp_path)
    assert result.passed and not result.evidence and result.checked["processes"] == 0


def test_a_divergent_hash_breaks_log_matching_only(tmp_path):
    traces = clean_traces()
    for r in traces["p2-cc03"]:
        if r["kind"] == "applied" and r["index"] >= 32:
            r["hash"] = "f" * 64                             # p2 applied other entries from index 17 on
    result = check_dir(write(tmp_path, traces))
    assert only_failing(result) == ["log_matching"] and result.counts["log_matching"] == 2
    example = result.examples["log_matching"][0]
    assert example.startswith("index 32:") and NODES["p2"] in example and NODES["p0"] in example


def test_two_leaders_in_one_term_break_election_safety_only(tmp_path):
    traces = clean_traces()
    rogue = dict(traces["p2-cc03"][0], kind="leader", term=2, t=3.5)
    del rogue["voter"]
    traces["p2-cc03"].insert(1, rogue)
    result = check_dir(write(tmp_path, traces))
    assert only_failing(result) == ["one_leader_per_term"] and result.counts["one_leader_per_term"] == 1
    assert result.examples["one_leader_per_term"][0].startswith("term 2: 2 leaders")
    assert NODES["p1"] in result.examples["one_leader_per_term"][0]


def test_one_incarnation_registered_at_two_indexes_breaks_register_once_only(tmp_path):
    traces = clean_traces()
    for r in traces["p1-bb02"]:
        if r["kind"] == "register" and (r["peer_id"], r["incarnation"]) == ("p1", 2):
            r["incarnation"] = 1                            # a parallel lineage admitted p1#1 again
    result = check_dir(write(tmp_path, traces))
    assert only_failing(result) == ["register_once"] and result.counts["register_once"] == 1
    assert result.examples["register_once"][0].startswith("p1#1 registered at index 2")
    assert "index 45" in result.examples["register_once"][0]


def test_a_generation_activated_twice_breaks_generation_once_only(tmp_path):
    traces = clean_traces()
    for r in traces["p0-aa01"]:
        if r["kind"] == "activated" and r["generation"] == 2:
            r["members"] = [["p0", 1], ["p2", 1]]           # same generation number, another member set
    result = check_dir(write(tmp_path, traces))
    assert only_failing(result) == ["generation_once"] and result.counts["generation_once"] == 1
    assert "generation 2 activated as index 46 [p0#1 p2#1]" in result.examples["generation_once"][0]


def test_a_cut_last_line_and_application_records_are_tolerated_a_bad_middle_line_is_listed(tmp_path):
    traces = clean_traces()
    write(tmp_path, traces, tail={"p0-aa01": '{"t": 99.0, "kind": "appl'})
    (tmp_path / "p0-1.jsonl").write_text(json.dumps({"t": 1.0, "peer": "p0", "event": "commit"}) + "\n")
    bad = tmp_path / "p1-bb02.jsonl"
    lines = bad.read_text().splitlines()
    lines.insert(3, "garbage")
    lines.insert(4, json.dumps({"t": 1.0, "kind": "applied", "agent": "x", "instance": "y", "index": "7"}))
    bad.write_text("\n".join(lines) + "\n")
    traces_read = load(tmp_path)
    result = check(traces_read)
    assert result.passed and traces_read.truncated == 1 and traces_read.files == 4
    assert [u.split(":")[1] for u in result.unreadable] == ["4", "5"]
    assert "lacks 'index'" in result.unreadable[1] and "cut line" in result.render()


def test_activations_are_deduplicated_in_log_order_with_their_earliest_time(tmp_path):
    traces = clean_traces()
    traces["p2-cc03"] = [dict(r, t=r["t"] - 1) for r in traces["p2-cc03"]]
    acts = activations(load(write(tmp_path, traces)))
    assert [(a.generation, a.index, a.revision) for a in acts] == [(1, 4, 0), (2, 46, 12)]
    assert acts[1].members == (("p0", 1), ("p2", 1), ("p1", 2)) and acts[1].t == pytest.approx(13.6)


def test_check_traces_cli_exits_1_on_a_violation_or_on_no_trace_at_all(tmp_path, capsys):
    from p2pgen.cli import main
    assert main(["check-traces", str(tmp_path)]) == 1
    write(tmp_path, clean_traces())
    assert main(["check-traces", str(tmp_path)]) == 0
    traces = clean_traces()
    traces["p0-aa01"][1]["term"] = 2                           # p0 and p1 both lead term 2
    write(tmp_path, traces)
    assert main(["check-traces", "--json", str(tmp_path)]) == 1
    assert '"one_leader_per_term": 1' in capsys.readouterr().out
