"""Behaviours no other test covered (issue 29: an audit planted bugs the local tiers did not catch).
Tests that belong to no module's own test file live here."""

import re
from collections import deque

import pytest

from conftest import ROOT


def makefile_rules(text: str) -> dict[str, tuple[list[str], list[str]]]:
    """{target: (prerequisites, recipe lines)} of a Makefile, continuation lines joined."""
    rules: dict[str, tuple[list[str], list[str]]] = {}
    current = None
    for line in text.replace("\\\n", " ").splitlines():
        if line.startswith("\t"):
            if current is not None:
                rules[current][1].append(line.strip())
            continue
        rule = re.match(r"^([^\s:#=]+)\s*:(?!=)\s*(.*)$", line)  # `target: prerequisites`, not `NAME := value`
        if rule:
            current = rule.group(1)
            rules[current] = (rule.group(2).split("#")[0].split(), [])
        elif line.strip() and not line.startswith("#"):
            current = None
    return rules


def reached_from(rules: dict, target: str) -> list[str]:
    """`target` and every target it depends on, directly or not, or makes in its recipe (`$(MAKE) a b`)."""
    seen, queue = [], deque([target])
    while queue:
        name = queue.popleft()
        if name in seen or name not in rules:
            continue
        seen.append(name)
        queue.extend(rules[name][0])
        for line in rules[name][1]:
            for command in re.split(r"[;&|]+", line):
                words = command.lstrip("@-+ ").split()  # a recipe line's @ (silent), - and + prefixes
                if words and words[0] in ("$(MAKE)", "${MAKE}", "make"):
                    queue.extend(word for word in words[1:] if word in rules)
    return seen


def runs_the_mpi_tier_through_jaxlaunch(words: list[str]) -> bool:
    """`jaxlaunch run SPEC` where SPEC runs pytest (`entrypoint: pytest`) with --with-mpi on tests/mpi
    on 2 processes: jaxlaunch starts them under mpirun (issue 32)."""
    run = next((i for i, word in enumerate(words) if word.endswith("jaxlaunch") and words[i + 1:i + 2] == ["run"]),
               None)
    if run is None or len(words) < run + 3:
        return False
    from launcher.spec import load_spec

    spec = load_spec(ROOT / words[run + 2])
    return (spec.entrypoint == "pytest" and spec.num_processes == 2 and "--with-mpi" in spec.args
            and any(a.rstrip("/") == "tests/mpi" for a in spec.args))


def runs_the_mpi_tier_on_two_processes(line: str) -> bool:
    """`mpirun -n 2 ... pytest --with-mpi ... tests/mpi` (also -np 2 / --np 2, options in between),
    or `jaxlaunch run` of a spec that does the same."""
    words = line.split()
    if runs_the_mpi_tier_through_jaxlaunch(words):
        return True
    mpirun = next((i for i, word in enumerate(words) if word == "mpirun" or word.endswith("/mpirun")), None)
    if mpirun is None:
        return False
    after = words[mpirun + 1:]
    two = any(word in ("-n", "-np", "--np", "-c") and value == "2" for word, value in zip(after, after[1:]))
    return two and "pytest" in after and "--with-mpi" in after and any(w.rstrip("/") == "tests/mpi" for w in after)


def test_make_test_and_ci_run_the_mpi_tier_under_mpirun_with_two_processes():
    """Issue 29: the unit tier runs tests/mpi at ONE process, where a collective has no peer; a
    staged-buffer bug showed only under `mpirun -n 2`. So `make test` (what .ci/run runs) must keep
    running the test-mpi tier, with two processes."""
    ci = [line.split() for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith("#")]
    assert any(words[0] in ("make", "$MAKE", "${MAKE}") and "test" in words[1:] for words in ci), \
        ".ci/run no longer runs `make test`"
    rules = makefile_rules((ROOT / "Makefile").read_text())
    assert "test" in rules, "the Makefile has no `test` target"
    reached = reached_from(rules, "test")
    tier = [(target, line) for target in reached for line in rules[target][1] if runs_the_mpi_tier_on_two_processes(line)]
    assert tier, (f"`make test` (targets {reached}) no longer runs `mpirun -n 2 ... pytest --with-mpi tests/mpi`; "
                  f"the collective tests then only ever run at one process")


@pytest.mark.parametrize("target", ["test", "test-sequential"])
def test_make_test_runs_every_tier(target):
    """`make test` runs every tier (it starts them in its recipe, the Slurm tier beside the others); so
    does `make test-sequential`, one after the other."""
    reached = reached_from(makefile_rules((ROOT / "Makefile").read_text()), target)
    assert {"test-unit", "test-e2e", "test-slurm", "test-mpi", "docs"} <= set(reached), reached


def test_the_makefile_reader_follows_prerequisites_and_joined_lines():
    """The reader above, on a Makefile of its own: the test is only as good as it."""
    rules = makefile_rules("PY := python\nall: a\n\techo all\na: b # why\nb:\n\tmpirun -n 2 \\\n\t    $(PY) -m pytest"
                           " --with-mpi tests/mpi\nc:\n\tmpirun -n 1 pytest --with-mpi tests/mpi\n")
    assert reached_from(rules, "all") == ["all", "a", "b"] and "PY" not in rules
    made = makefile_rules("all: a\n\t@$(MAKE) -k b > log & pid=$$!; $(MAKE) --no-print-directory c; wait\n"
                          "a:\nb:\nc:\nd:\n")
    assert reached_from(made, "all") == ["all", "a", "b", "c"]
    assert [runs_the_mpi_tier_on_two_processes(line) for line in rules["b"][1] + rules["c"][1]] == [True, False]
