"""`make mutate`'s score: for each module named, how many of mutmut's mutants the unit tier killed,
and which survived (mutmut 3 keeps each file's results in mutants/PATH.py.meta)."""

import json
import sys
from collections import Counter
from pathlib import Path

KILLED = {1, 3, 37}                   # tests failed, pytest's internal error, the type check caught it
SURVIVED = {0}
NOT_TESTED = {5, 33, None}            # no test reaches the mutated function


def score(mutants: Path, module: str) -> tuple[Counter, list[str]]:
    meta = mutants / (module.replace(".", "/") + ".py.meta")
    if not meta.exists():
        meta = mutants / module.replace(".", "/") / "__init__.py.meta"
    codes = json.loads(meta.read_text()).get("exit_code_by_key", {}) if meta.exists() else {}
    counts = Counter("killed" if c in KILLED else "survived" if c in SURVIVED else "no test" if c in NOT_TESTED
                     else "other" for c in codes.values())
    return counts, sorted(name for name, code in codes.items() if code in SURVIVED)


def main(argv: list[str]) -> int:
    mutants, modules = Path(argv[0]), argv[1:]
    total = Counter()
    for module in modules:
        counts, survivors = score(mutants, module)
        total += counts
        judged = counts["killed"] + counts["survived"]
        share = f"{100 * counts['killed'] / judged:.0f}%" if judged else "-"
        print(f"{module}: {counts['killed']} killed, {counts['survived']} survived, {counts['no test']} not reached "
              f"by a unit test ({share} of the reached killed)")
        for name in survivors:
            print(f"  survived: {name}   (see it: mutmut show {name})")
    judged = total["killed"] + total["survived"]
    if judged:
        print(f"mutation score: {100 * total['killed'] / judged:.0f}% ({total['killed']} of {judged} reached mutants killed)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
