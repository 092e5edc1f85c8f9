"""The repository stands alone: README.md, CHANGELOG.md, sims/README.md, docs/**/*.md and the Python sources.

Pure and fast (reads files, no network). Each check is a function that returns its problems as
`file:line: what` strings, run on the real files and, to show it can fail, on a doctored input:

- every relative Markdown link names a file or folder that exists inside the repository (anchors stripped);
- no text points outside the repository: `../shared`, DESIGN.md, issue numbers ("issue 4", "issues #12",
  "(issue"), seed documents ("the seed documents", "seed-001", "seed 000", "the seed's", "seed model"), or an
  absolute path of some machine (`/root/`, `/work/`, `/home/`, `/tmp/`, `/Users/`). The same rules hold for
  every line of the Python files under p2pgen/, p2pgen_lab/, tests/, examples/ and sims/ (docstrings,
  comments and strings alike; this file, which lists the bad examples, excepted), where a `dir/page.md` path
  must also name a page that exists. A random seed (`--seed`, RNG seeds) and the seed agent of
  `p2pgen recover` stay ordinary words; write the latter "the seed agent's", not "the seed's";
- README.md is at most 200 lines and opens with the two commands (demo, tests), whose files exist;
- docs/design/design.md defines each invariant I1..I8, and every invariant the code cites;
- every `P2PGEN_*` variable the docs mention is in docs/reference/environment.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 200
INVARIANTS = [f"I{i}" for i in range(1, 9)]

REQUIRED = [
    "README.md", "CHANGELOG.md",
    "docs/guide/training-loop.md", "docs/guide/torch.md", "docs/guide/running-on-hosts.md",
    "docs/guide/operating.md", "docs/guide/gpus.md", "docs/guide/limitations.md",
    "docs/reference/api.md", "docs/reference/cli.md", "docs/reference/environment.md", "docs/reference/json.md",
    "docs/design/design.md",
]

# (pattern, why it is refused); matched case-insensitively on every line, code blocks included
FORBIDDEN = [
    (r"\.\./shared", "points outside the repository (../shared)"),
    (r"(?-i:DESIGN\.md)", "names a design document outside the repository (the design is docs/design/design.md)"),
    (r"\bissues?\s+#?\d+", "cites an issue number; describe the feature instead"),
    (r"#\d+\s+issue", "cites an issue number; describe the feature instead"),
    (r"\(issues?\b(?!\s+#?\d)", "cites an issue; describe the feature instead"),
    (r"\bseed\s+documents?\b", "refers to seed documents outside the repository"),
    (r"\bthe\s+seeds\b", "refers to seed documents outside the repository"),
    (r"\bseeds/", "refers to seed documents outside the repository"),
    (r"(?<![-\w])seed[\s-]+\d{3}\b", "refers to a seed document by number"),
    (r"\bseed's\b", "refers to a seed document outside the repository (the recovery seed: \"the seed agent's\")"),
    (r"\bseed\s+model\b", "refers to a seed document's model; name the model itself"),
    (r"(?<![\w.~$/-])/(?:root|work|home|tmp|Users)/", "an absolute path of some machine"),
]

# every match of FORBIDDEN holds one of these (in lower case): lines without any are skipped, which keeps the scan fast
CUE = re.compile(r"\.\./shared|design\.md|issue|seed|/(?:root|work|home|tmp|users)/")
PYTHON_FOLDERS = ("p2pgen", "p2pgen_lab", "tests", "examples", "sims")
PAGE_PATH = re.compile(r"(?<![\w./-])((?:[\w-]+/)+[\w.-]+\.md)\b")

LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.I)
FENCE = re.compile(r"^\s*(```|~~~)")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "sims" / "README.md",
            *sorted((ROOT / "docs").rglob("*.md"))]


def python_files() -> list[Path]:
    """The Python files of the repository's packages, tests, examples and sims, this file excepted."""
    own = Path(__file__).resolve()
    return [path for folder in PYTHON_FOLDERS for path in sorted((ROOT / folder).rglob("*.py")) if path != own]


def rel(path: Path) -> str:
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def without_code(text: str) -> str:
    """The text with fenced blocks and inline code blanked out, newlines kept (so line numbers hold)."""
    out, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            out.append("")
        elif fenced:
            out.append("")
        else:
            out.append(re.sub(r"`[^`]*`", lambda m: " " * len(m.group()), line))
    return "\n".join(out)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation other than - and _ dropped, spaces to -."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor in a Markdown page (a repeated heading gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6} +(.+?) *#*$", without_fences(text), re.M):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def without_fences(text: str) -> str:
    """`text` with fenced code blocks blanked (a `#` comment there is not a heading)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def broken_links(path: Path, text: str, root: Path = ROOT) -> list[str]:
    """Relative links whose target does not exist, lies outside the repository, or names an anchor that no
    heading of the target Markdown page has."""
    problems = []
    prose = without_code(text)
    for m in LINK.finditer(prose):
        target = m.group(1)
        if EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.split("?", 1)[0].partition("#")
        line = prose.count("\n", 0, m.start(1)) + 1
        where = f"{rel(path)}:{line}"
        if not file_part:
            if anchor not in anchors(text):
                problems.append(f"{where}: link {target!r}: this page has no heading with anchor #{anchor}")
            continue
        resolved = (path.parent / file_part).resolve()
        if resolved != root and root not in resolved.parents:
            problems.append(f"{where}: link {target!r} leaves the repository")
        elif not resolved.exists():
            problems.append(f"{where}: link {target!r}: {rel(resolved)} does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text()):
            problems.append(f"{where}: link {target!r}: {rel(resolved)} has no heading with anchor #{anchor}")
    return problems


def forbidden_text(path: Path, text: str) -> list[str]:
    problems = []
    for n, line in enumerate(text.split("\n"), 1):
        if not CUE.search(line.lower()):
            continue
        for pattern, why in FORBIDDEN:
            for m in re.finditer(pattern, line, re.I):
                problems.append(f"{rel(path)}:{n}: {m.group()!r}: {why}")
    return problems


def python_problems(path: Path, text: str, root: Path = ROOT) -> list[str]:
    """What `forbidden_text` finds in a Python file, and every `dir/page.md` it names that does not exist."""
    problems = forbidden_text(path, text)
    for n, line in enumerate(text.split("\n") if ".md" in text else [], 1):
        for m in PAGE_PATH.finditer(line):
            if not (root / m.group(1)).is_file():
                problems.append(f"{rel(path)}:{n}: {m.group(1)!r}: names a page that is not in the repository")
    return problems


def readme_problems(path: Path, text: str, root: Path = ROOT) -> list[str]:
    problems = []
    lines = text.split("\n")
    count = len(lines) - (1 if text.endswith("\n") else 0)
    if count > README_MAX_LINES:
        problems.append(f"{rel(path)}:{README_MAX_LINES + 1}: README.md has {count} lines, "
                        f"at most {README_MAX_LINES} (move the rest into docs/)")
    start = next((i for i, line in enumerate(lines) if FENCE.match(line)), None)
    if start is None or any(line.strip().startswith("$ ") for line in lines[:start]):
        return problems + [f"{rel(path)}:1: README.md must open with a code block holding its two commands"]
    end = next((i for i in range(start + 1, len(lines)) if FENCE.match(lines[i])), len(lines))
    commands = [line for line in lines[start + 1:end] if line.strip()]
    demo = [c for c in commands if "p2pgen join --local" in c and "examples/train_spot.py" in c]
    tests = [c for c in commands if "-m pytest -q" in c]
    if len(commands) != 2 or len(demo) != 1 or len(tests) != 1:
        problems.append(f"{rel(path)}:{start + 2}: the first code block must hold exactly the demo command "
                        f"(p2pgen join --local ... examples/train_spot.py) and the test command (-m pytest -q)")
    for command in commands:
        for name in re.findall(r"\b(?:examples|tests)/[\w./-]+\.py\b", command):
            if not (root / name).exists():
                problems.append(f"{rel(path)}:{start + 2}: the command runs {name}, which does not exist")
    return problems


def invariant_problems(path: Path, text: str, cited: set[str] = frozenset()) -> list[str]:
    """Each of I1..I8 (and every invariant the code cites) defined once as `- **In: Name.** statement`."""
    problems = []
    for name in sorted(set(INVARIANTS) | set(cited), key=lambda s: int(s[1:])):
        found = re.findall(rf"^\s*[-*]\s+\*\*{name}:\s+[^*\n]+\*\*\s+\S.{{20,}}", text, re.M)
        if len(found) != 1:
            problems.append(f"{rel(path)}:1: invariant {name} must be defined exactly once as "
                            f"'- **{name}: Name.** statement' (found {len(found)})")
    return problems


def cited_invariants() -> set[str]:
    cited = set()
    for folder in ("p2pgen", "tests"):
        for source in (ROOT / folder).rglob("*.py"):
            if source == Path(__file__).resolve():
                continue                                # this file names I9 on purpose
            cited.update(re.findall(r"\bI\d+\b", source.read_text(encoding="utf-8")))
    return cited


def undocumented_variables(texts: dict[Path, str], reference: str) -> list[str]:
    documented = set(re.findall(r"\bP2PGEN_[A-Z0-9_]+", reference))
    problems = []
    for path, text in texts.items():
        for n, line in enumerate(text.split("\n"), 1):
            for var in re.findall(r"\bP2PGEN_[A-Z0-9_]+", line):
                if var not in documented:
                    problems.append(f"{rel(path)}:{n}: {var} is not in docs/reference/environment.md")
    return problems


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def fail_on(problems: list[str]) -> None:
    assert not problems, "\n" + "\n".join(problems)


# ---------------------------------------------------------------- the real files

def test_required_pages_exist():
    fail_on([f"{name}: missing" for name in REQUIRED if not (ROOT / name).is_file()])


def test_relative_links_resolve():
    fail_on([p for path in doc_files() for p in broken_links(path, read(path))])


def test_no_references_outside_the_repository():
    fail_on([p for path in doc_files() for p in forbidden_text(path, read(path))])


def test_python_sources_do_not_point_outside_the_repository():
    fail_on([p for path in python_files() for p in python_problems(path, read(path))])


def test_readme_is_a_front_door():
    path = ROOT / "README.md"
    fail_on(readme_problems(path, read(path)))


def test_design_defines_every_invariant():
    path = ROOT / "docs" / "design" / "design.md"
    fail_on(invariant_problems(path, read(path), cited_invariants()))


def test_every_variable_is_in_the_environment_reference():
    reference = read(ROOT / "docs" / "reference" / "environment.md")
    fail_on(undocumented_variables({path: read(path) for path in doc_files()}, reference))


# ---------------------------------------------------------------- each check can fail

def test_a_broken_link_is_named_with_file_and_line(tmp_path):
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    (tmp_path / "docs" / "there.md").write_text("# Part\n\n```\n# not a heading\n```\n## `compress=`: Part\n")
    text = ("# t\n[ok](there.md#part) [web](https://example.com) [here](#t) [code](there.md#compress-part)\n\n"
            "[gone](missing.md#a)\n```\n[not a link](nowhere.md)\n```\n[out](../../elsewhere.md)\n"
            "[no anchor](there.md#not-a-heading) [none here](#x)\n")
    problems = broken_links(page, text, root=tmp_path)
    assert len(problems) == 4, problems
    assert "page.md:4" in problems[0] and "missing.md" in problems[0]
    assert "page.md:8" in problems[1] and "leaves the repository" in problems[1]
    assert "page.md:9" in problems[2] and "no heading with anchor #not-a-heading" in problems[2]
    assert "page.md:9" in problems[3] and "this page has no heading with anchor #x" in problems[3]


@pytest.mark.parametrize("bad", [
    "see ../shared/notes/x.md", "as DESIGN.md says", "fixed in issue 16", "(issues #12)", "#7 issue",
    "the seed documents", "read the seeds first", "seeds/README.md", "seed 000's fields",
    "the seed's tables", "at /root/x", "in `/work/main`", "/home/me/.cache", "--secret-file /tmp/s",
])
def test_forbidden_text_is_named_with_file_and_line(bad):
    problems = forbidden_text(ROOT / "docs" / "x.md", f"fine\n{bad}\n")
    assert problems and all(p.startswith("docs/x.md:2: ") for p in problems), problems


@pytest.mark.parametrize("fine", ["--seed 1", "a seeded plan", "the seed agent", "/dev/shm", "sims/README.md",
                                  "/proc/self/fd", "in issue order", "run #19"])
def test_forbidden_text_leaves_ordinary_words_alone(fine):
    assert forbidden_text(ROOT / "docs" / "x.md", fine) == []


@pytest.mark.parametrize("bad", [
    '"""Integration: the step loop on real processes (issue 4\'s "must show")."""',
    "# the fault kinds added for whole-host churn (issues 12 and 13)",
    "x = 1  # (issue: the leader-loss work)",
    '"""`p2pgen bench channel`: the seed-001 experiment on CPU."""',
    '"""Seed 000\'s manifest record of one sharded object."""',
    'Scenario(name="seed model", duration=duration)',
    "# The seed's published figures: timeout -> (detect lat, FP rate, overhead)",
    'label="seed\'s published goodput (additive)")',
    '"""Shared state and catch-up (DESIGN.md, "State sync")."""',
    "# kept as the seed documents describe it",
    "- Two-way identity (notes/pysyncobj.md, item 15).",
    "# see ../shared/notes/pysyncobj.md",
    'CACHE = "/root/.cache/p2pgen"',
])
def test_python_that_points_outside_is_named_with_file_and_line(bad):
    problems = python_problems(ROOT / "p2pgen" / "x.py", f"import os\n{bad}\n")
    assert problems and all(p.startswith("p2pgen/x.py:2: ") for p in problems), problems


@pytest.mark.parametrize("fine", [
    'parser.add_argument("--seed", type=int, default=0, help="first seed (default 0)")',
    "rng = np.random.default_rng(seed + 100)",
    'cmd = ["p2pgen", "chaos", "--seed", "1", "--chaos-seed 123"]',
    '"""Adopt the seed agent\'s state as the first entry of a new Raft epoch."""',
    'note = f"re-formed in Raft epoch {epoch} from seed agent {seed}"',
    "self.membership.reform_as_seed(epoch, gone)",
    "for w in works:  # all ran before this (in issue order)",
    "dict(s.as_dict(), mtbf=m, seed_reference=SEED_MTBF_ROWS[m])",
    "# (docs/design/pysyncobj.md, pitfall 15); see sims/README.md",
    '"""The two tables of the published churn study, computed by running the simulator."""',
])
def test_python_that_stays_inside_passes(fine):
    assert python_problems(ROOT / "p2pgen" / "x.py", fine) == []


def test_a_long_readme_or_a_lost_command_fails():
    path = ROOT / "README.md"
    good = read(path)
    assert readme_problems(path, good) == []
    assert any("lines, at most" in p for p in readme_problems(path, good + "x\n" * README_MAX_LINES))
    lost = good.replace("-m pytest -q", "-m pytest", 1)
    assert any("first code block" in p for p in readme_problems(path, lost))
    moved = good.replace("examples/train_spot.py", "examples/no_such_demo.py", 1)
    assert any("does not exist" in p for p in readme_problems(path, moved))


def test_a_missing_invariant_fails():
    path = ROOT / "docs" / "design" / "design.md"
    text = read(path)
    assert invariant_problems(path, text) == []
    doctored = re.sub(r"\*\*I6:", "**I6 (gone):", text)
    assert [p for p in invariant_problems(path, doctored) if "I6" in p]
    assert [p for p in invariant_problems(path, text, {"I9"}) if "I9" in p]


def test_an_undocumented_variable_fails():
    problems = undocumented_variables({ROOT / "docs" / "x.md": "a\nset P2PGEN_NOT_A_THING=1\n"}, "P2PGEN_JOB")
    assert problems == ["docs/x.md:2: P2PGEN_NOT_A_THING is not in docs/reference/environment.md"]
