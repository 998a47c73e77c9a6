"""The roll-call: on any hang (the hang watchdog, `collective_timeout`, `timeout`), which ranks wait
for their peers and which rank holds them up, from the places every rank reported when asked for
its stacks (launcher/rank/stacks.py: the innermost frame of the job's own code, and what the
thread does there).

Most ranks of a hung job wait at the same place (inside an XLA execution, a barrier, a launcher
collective); the ranks that are elsewhere (in their own code: a loader, a lock, a sleep; in a
checkpoint read; or not answering at all) are the culprits. One line says it:

    1 of 2 ranks wait in XLA (train.py:88 in main, calling train_step); rank 1 on node2 is
    elsewhere: loader.py:41 in read_batch (time.sleep)

A culprit is named only when some ranks do wait for peers and not every rank is a culprit: a job
in which no rank waits (each busy in its own code) or every rank waits at one place has no rank to
blame, and the line says that instead.
"""

from __future__ import annotations

import os

WAITING_KINDS = ("xla", "collective", "barrier", "mpi4jax", "mpi")  # as launcher/rank/stacks.py
KIND_WORDS = {"xla": "in XLA", "collective": "in a launcher collective", "barrier": "at a barrier",
              "mpi4jax": "in mpi4jax", "mpi": "in MPI", "checkpoint": "in a checkpoint save or restore",
              "compiling": "compiling", "own": "in its own code", "child": "waiting on its child process",
              "network": "waiting on the network", "callback": "in a host callback"}


def _short(where: str | None) -> str:
    """'/path/to/train.py:88 in main' -> 'train.py:88 in main'."""
    if not where:
        return "?"
    path, sep, rest = where.partition(":")
    return os.path.basename(path) + sep + rest


def _place_of(state: dict) -> dict:
    """A rank state's place; a rank of an older jaxlaunch (no place) from its collective."""
    place = state.get("place")
    if isinstance(place, dict) and place.get("kind"):
        return place
    waiting = state.get("waiting_in")
    if waiting:
        return {"kind": "collective", "detail": f"launcher.{waiting.get('name')}", "where": state.get("where")}
    return {"kind": "own", "detail": None, "where": state.get("where")}


def _what(place: dict) -> str:
    """'train.py:88 in main, calling train_step' / '... (time.sleep)'."""
    text = _short(place.get("where"))
    detail = place.get("detail")
    if detail:
        text += f", calling {detail}" if place["kind"] in WAITING_KINDS else f" ({detail})"
    return text


def roll_call(num_processes: int, rank_states: list[dict], finished_ranks=frozenset(),
              hosts: dict[int, str] | None = None, named: list[int] | None = None) -> dict:
    """{"line", "waiting": {"kind", "where", "detail", "ranks"} or None, "culprits": [{"rank",
    "host", "kind", "where", "detail", "why"}]}: see the module doc."""
    hosts = hosts or {}
    by_rank = {s["rank"]: s for s in rank_states if isinstance(s.get("rank"), int)}
    places = {rank: _place_of(state) for rank, state in by_rank.items()}
    groups: dict[tuple, list[int]] = {}
    for rank, place in sorted(places.items()):
        if place["kind"] in WAITING_KINDS:
            groups.setdefault((place["kind"], place.get("where"), place.get("detail")), []).append(rank)
    # The largest group of waiting ranks; on a tie, the one holding the lowest rank.
    waiting_key = max(groups, key=lambda k: (len(groups[k]), -groups[k][0])) if groups else None
    waiting_ranks = groups.get(waiting_key, [])
    others = []
    for rank in range(num_processes):
        if rank in waiting_ranks:
            continue
        host = (by_rank.get(rank) or {}).get("host") or hosts.get(rank)
        if rank not in places:
            why = ("had left its entrypoint" if rank in finished_ranks
                   else "did not answer (dead, or stuck in C code holding the GIL)")
            others.append({"rank": rank, "host": host, "kind": None, "where": None, "detail": None, "why": why})
            continue
        place = places[rank]
        others.append({"rank": rank, "host": host, "kind": place["kind"], "where": place.get("where"),
                       "detail": place.get("detail"),
                       "why": f"{KIND_WORDS.get(place['kind'], place['kind'])} at {_what(place)}"})
    waiting = None
    if waiting_key is not None:
        kind, where, detail = waiting_key
        waiting = {"kind": kind, "where": where, "detail": detail, "ranks": waiting_ranks}
    # A rank waiting for a peer somewhere else (another collective) holds nobody up by itself: the
    # culprits are the ranks that do not wait for a peer, never a waiting group picked by rank number.
    culprits = [o for o in others if o["kind"] not in WAITING_KINDS] if waiting is not None else []
    line = _line(num_processes, waiting, others)
    if named:
        # One verdict: the ranks the hang watchdog named from the evidence it had (a stopped
        # process, a silent rank, an idle rank apart) are the culprits, whatever they answered at
        # the stop (a stopped rank that mpirun's teardown woke answers from where it froze).
        by_number = {o["rank"]: o for o in others}
        culprits = [by_number.get(r) or {"rank": r, "host": (by_rank.get(r) or {}).get("host") or hosts.get(r),
                                         "kind": None, "where": None, "detail": None,
                                         "why": "named by the hang watchdog"} for r in named]
        line += "; the watchdog named " + ", ".join(_named(c) for c in culprits[:4])
    return {"line": line, "waiting": waiting, "culprits": culprits}


def _named(record: dict) -> str:
    host = f" on {record['host']}" if record.get("host") else ""
    return f"rank {record['rank']}{host}"


def _line(num_processes: int, waiting: dict | None, others: list[dict]) -> str:
    if waiting is None:
        listing = "; ".join(f"{_named(o)}{' ' if o['kind'] is None else ': '}{o['why']}" for o in others[:4])
        more = f"; and {len(others) - 4} more" if len(others) > 4 else ""
        return f"no rank waits for a peer ({listing}{more})"
    count = len(waiting["ranks"])
    verb = "waits" if count == 1 else "wait"
    place = {"kind": waiting["kind"], "where": waiting["where"], "detail": waiting["detail"]}
    head = (f"{count} of {num_processes} rank{'s' if num_processes > 1 else ''} {verb} "
            f"{KIND_WORDS[waiting['kind']]} ({_what(place)})")
    if not others:
        return head + "; no rank is elsewhere (a deadlock inside the collective itself, or a peer outside the job)"
    shown = others[:4]
    parts = []
    for other in shown:
        if other["kind"] is None:
            parts.append(f"{_named(other)} {other['why']}")
        elif other["kind"] in WAITING_KINDS:
            parts.append(f"{_named(other)} waits for a peer elsewhere: {other['why']}")
        else:
            parts.append(f"{_named(other)} is elsewhere: {other['why']}")
    more = f"; and {len(others) - 4} more ranks elsewhere" if len(others) > 4 else ""
    return head + "; " + "; ".join(parts) + more


def culprit_nodes(roll: dict | None) -> dict[str, str]:
    """{node: why} for the nodes of the ranks a roll-call named (for a requeue without them)."""
    nodes: dict[str, str] = {}
    for record in (roll or {}).get("culprits") or []:
        if record.get("host"):
            nodes.setdefault(record["host"], f"rank {record['rank']} held the job up ({record['why']})")
    return nodes
