"""The hang watchdog weighs evidence beyond the main thread's stack (issue 51): a stopped or silent
rank is a culprit in any phase; a rank waiting on its child, the network or a host callback, or
moving bytes, is not one on the short bound; a compile has a bound of its own; a rank that may be
going silent is never out-voted by its last word. Fake clock throughout: no test here waits."""

from launcher.spec.model import HANG_FLOOR_SECONDS, HANG_SPLIT_SECONDS
from launcher.supervisor.watchdog import (COMPILE_FACTOR, COMPILE_FLOOR_SECONDS, SILENT_SECONDS, STOPPED_SECONDS,
                                          HangWatchdog, suggested_timeout)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def activity(stack, kind=None, moved=0, busy=0.0, children_busy=0.0, io=0.0):
    return {"time": 0.0, "stack": stack, "moved": moved, "busy": busy, "where": f"prog.py:1 in {stack}",
            "doing": kind, "children_busy": children_busy, "io": io}


def tell(dog, places, evidence=None):
    """Every rank in `places` ({rank: (stack, kind)}) sends its activity; `evidence`: {rank: {busy...}}."""
    for rank, (stack, kind) in places.items():
        dog.activity(rank, activity(stack, kind, **(evidence or {}).get(rank, {})))


def run_for(dog, clock, seconds, places, evidence=None):
    """`seconds` of a stall, every rank in `places` telling every 2 s, as monitors do."""
    for _ in range(int(seconds // 2)):
        clock.now += 2
        tell(dog, places, evidence)
    clock.now += seconds % 2


def started(dog, places):
    for rank, (stack, _) in places.items():
        dog.activity(rank, activity(stack, moved=1))


# --- a hang it never caught -------------------------------------------------------------------

def test_a_rank_frozen_while_it_compiles_is_named_once_it_is_silent():
    """Finding 1: rank 1 SIGSTOPped during its jit compile, rank 0 waiting in comm.allreduce. The
    compile mark never cleared and switched the watchdog off for good; silence overrides the phase."""
    clock = Clock()
    dog = HangWatchdog("auto", clock, size=2)
    started(dog, {0: ("allreduce", None), 1: ("jit", None)})
    dog.phase(1, "compiling")
    clock.now += 3  # rank 1's last word, then SIGSTOP
    dog.activity(1, activity("jit", "compiling", moved=1, busy=1.0))
    run_for(dog, clock, HANG_SPLIT_SECONDS - 5, {0: ("allreduce", "mpi")})
    assert dog.check() is None
    run_for(dog, clock, 10, {0: ("allreduce", "mpi")})
    found = dog.check()
    assert found is not None and "rank 1 (last at prog.py:1 in jit) stopped telling where it stands" in found, found
    assert dog.verdict == {"rule": "silent", "culprits": [1]}


def test_a_stopped_rank_process_is_a_hang_within_seconds_in_any_phase():
    """The supervisor reads /proc: a rank in state T while the others run is named after
    STOPPED_SECONDS, compiling or not; the whole job stopped (a SIGTSTP to mpirun) is left alone."""
    clock = Clock()
    dog = HangWatchdog("auto", clock, size=2)
    started(dog, {0: ("allreduce", None), 1: ("jit", None)})
    dog.phase(1, "compiling")
    dog.process_states({0: "S", 1: "T"})
    clock.now += STOPPED_SECONDS - 1
    dog.process_states({0: "S", 1: "T"})
    assert dog.check() is None
    clock.now += 1.5
    dog.process_states({0: "R", 1: "T"})
    found = dog.check()
    assert found.startswith("rank 1 (stopped") and "state T" in found and "rule: stopped" in found, found
    assert dog.verdict == {"rule": "stopped", "culprits": [1]}
    dog.process_states({0: "T", 1: "T"})  # every rank suspended on purpose
    clock.now += 60
    assert dog.check() is None
    dog.process_states({0: "S", 1: "S"})  # SIGCONT: running again
    assert dog.check() is None


def test_a_compile_whose_stack_stands_still_has_a_bound_learned_from_the_jobs_compiles():
    """No phase stops the clock for ever: a compile that deadlocks (its stack standing still, its
    monitor alive) is ended past COMPILE_FLOOR_SECONDS, or COMPILE_FACTOR x the longest compile."""
    clock = Clock()
    dog = HangWatchdog("auto", clock, size=2)
    started(dog, {0: ("step", None), 1: ("jit", None)})
    dog.phase(1, "compiling")
    clock.now += 1000
    dog.phase(1, None)  # a 1000 s compile ended
    assert dog.compile_limit() == COMPILE_FACTOR * 1000
    dog.activity(1, activity("jit2", moved=1))
    dog.phase(1, "compiling")
    places = {0: ("step", "xla"), 1: ("jit2", "compiling")}
    run_for(dog, clock, COMPILE_FACTOR * 1000 - 10, places, {1: {"busy": 1.0}})
    assert dog.check() is None  # XLA's C++ passes, busy: a long compile
    run_for(dog, clock, 20, places)
    found = dog.check()
    assert "compiling with a stack that stands still" in found and "rule: compiling" in found, found
    assert dog.verdict["culprits"] == [1]
    fresh = HangWatchdog("auto", Clock(), size=1)
    assert fresh.compile_limit() == COMPILE_FLOOR_SECONDS


# --- jobs it killed that were not hung ------------------------------------------------------------

def test_a_rank_waiting_on_its_busy_child_is_not_a_culprit():
    """Finding 2: rank 0 waits in subprocess.run on a compress-and-upload at 100% CPU while rank 1
    waits in the next XLA step: TIMEOUT at 131 s before."""
    clock = Clock()
    dog = HangWatchdog("auto", clock, size=2)
    started(dog, {0: ("upload", None), 1: ("step", None)})
    places = {0: ("upload", "child"), 1: ("step", "xla")}
    run_for(dog, clock, 180, places, {0: {"children_busy": 1.0}})
    assert dog.check() is None
    # The same child seen only through its CPU (a wait in the job's own code on a pool's workers).
    places = {0: ("upload", "own"), 1: ("step", "xla")}
    run_for(dog, clock, 180, places, {0: {"children_busy": 1.0}})
    assert dog.check() is None


def test_a_host_callback_on_process_0_and_a_network_read_are_waits_not_culprits():
    """Finding 3: jax.pure_callback runs on process 0 only; its peers wait in XLA: TIMEOUT at 129 s
    before. A rank reading from an evaluation server waits on the network likewise."""
    for kind in ("callback", "network"):
        clock = Clock()
        dog = HangWatchdog("auto", clock, size=2)
        started(dog, {0: ("cb", None), 1: ("step", None)})
        run_for(dog, clock, 180, {0: ("cb", kind), 1: ("step", "xla")})
        assert dog.check() is None, kind
        run_for(dog, clock, HANG_FLOOR_SECONDS, {0: ("cb", kind), 1: ("step", "xla")})
        found = dog.check()  # the long bound still holds
        assert found is not None and "rule: together" in found, found


def test_a_rank_writing_or_reading_bytes_is_working():
    """rank 0 writes a checkpoint file of its own (no CPU to speak of, bytes moving) while the
    others wait in sync_global_devices."""
    clock = Clock()
    dog = HangWatchdog("auto", clock, size=3)
    started(dog, {0: ("write", None), 1: ("sync", None), 2: ("sync", None)})
    places = {0: ("write", "own"), 1: ("sync", "barrier"), 2: ("sync", "barrier")}
    run_for(dog, clock, 300, places, {0: {"io": 50e6}})
    assert dog.check() is None
    run_for(dog, clock, HANG_SPLIT_SECONDS + 4, places)  # the writes stopped: a stuck filesystem
    assert dog.check() is not None and dog.verdict == {"rule": "split", "culprits": [0]}


# --- the right rank named ---------------------------------------------------------------------------

def test_a_short_hang_timeout_does_not_name_the_healthy_rank_while_the_stopped_one_goes_silent():
    """Finding 5: the drill's hang_timeout=5, under SILENT_SECONDS. Rank 0 SIGSTOPped in its own code
    just before its step; rank 1 waits in XLA. Before, the split rule fired at 5 s on rank 0's last
    word and a tie-break named rank 1, the healthy rank."""
    clock = Clock()
    dog = HangWatchdog(5, clock, size=2)
    started(dog, {0: ("prepare", None), 1: ("step", None)})
    dog.activity(0, activity("prepare", "own"))  # its last word
    dog.activity(1, activity("step", "xla"))
    found = None
    for _ in range(10):
        clock.now += 2
        dog.activity(1, activity("step", "xla"))
        found = found or dog.check()
    assert found is not None and "rank 0" in found, found
    assert dog.verdict["culprits"] == [0]
    assert "rank 1" not in found.split(" while ")[0]


def test_the_learned_stall_is_the_jobs_not_one_ranks():
    """Rank 0 stands still for 300 s while rank 1 keeps moving: the job never stalled, so nothing is
    learned from rank 0's wait; a later stall of both at one place meets the floor (issue 55)."""
    clock = Clock()
    dog = HangWatchdog("auto", clock, size=2)
    started(dog, {0: ("wait", None), 1: ("work", None)})
    for _ in range(150):
        clock.now += 2
        dog.activity(0, activity("wait", "xla"))
        dog.activity(1, activity("work", moved=1, busy=1.0))
    clock.now += 2
    dog.activity(0, activity("next", moved=1))  # rank 0 moves on at last: its own wait was 302 s
    dog.activity(1, activity("next", moved=1))
    assert dog.longest_still <= 2
    run_for(dog, clock, HANG_FLOOR_SECONDS + 4, {0: ("next", "xla"), 1: ("next", "xla")})
    found = dog.check()
    assert found is not None and "every rank standing still at one place" in found, found


def test_the_stop_line_names_the_key_that_would_have_let_the_job_run_on():
    assert suggested_timeout(60) == "5m"
    assert suggested_timeout(400) == "14m"
    assert suggested_timeout(3600) == "2h"
    assert suggested_timeout(2000) == "1h7m"
    from launcher.spec.model import parse_hang_timeout

    for waited in (60, 400, 3600, 2000, 7 * 3600):
        assert parse_hang_timeout(suggested_timeout(waited)) >= 2 * waited
    assert SILENT_SECONDS > 5


def test_an_activity_carries_its_evidence_through_the_control_protocol():
    """What a rank's monitor sends is what the watchdog reads: the message's own `kind` is the
    protocol's, so what the rank does travels as `doing`."""
    from launcher.channel import Activity, encode, parse_line

    sent = Activity(1, 5.0, "abc", 0, 0.75, "prog.py:3 in main", 1.5, 2048.0, "child")
    kind, message = parse_line(encode("activity", sent))
    assert kind == "activity"
    clock = Clock()
    dog = HangWatchdog("auto", clock, size=2)
    dog.activity(1, message)
    assert {k: dog.stacks[1][k] for k in ("kind", "busy", "children_busy", "io", "where")} == {
        "kind": "child", "busy": 0.75, "children_busy": 1.5, "io": 2048.0, "where": "prog.py:3 in main"}


def test_a_rank_silent_while_it_waited_in_mpi_is_waiting_and_the_idle_rank_is_named():
    """mpi4py's pickled allreduce polls with the GIL held: the waiting rank's monitor goes silent.
    Its last word (in MPI) says where it is; the culprit is the rank asleep in its loader."""
    clock = Clock()
    dog = HangWatchdog("auto", clock, size=2)
    started(dog, {0: ("allreduce", None), 1: ("loader", None)})
    dog.activity(0, activity("allreduce", "mpi", busy=1.0))  # then silent
    run_for(dog, clock, HANG_SPLIT_SECONDS + 4, {1: ("loader", "own")})
    found = dog.check()
    assert found is not None and "rank 1 in its own code at prog.py:1 in loader" in found, found
    assert dog.verdict == {"rule": "split", "culprits": [1]}


def test_a_computing_thread_or_child_is_seen_running_and_a_sleeping_child_is_not():
    """evidence.runnable(): a worker thread or a child computing is in state R (running, or waiting
    for a CPU on a loaded machine); a child asleep is not. Real threads and processes."""
    import subprocess
    import sys
    import threading
    import time

    from launcher.rank import evidence

    stop = threading.Event()
    worker = threading.Thread(target=lambda: [sum(range(1000)) for _ in iter(stop.is_set, True)])
    worker.start()
    try:
        assert any(evidence.runnable() for _ in range(50))
    finally:
        stop.set()
        worker.join()
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert any(evidence.runnable() for _ in range(200) if not time.sleep(0.01))
        assert child.pid in evidence.descendants()
    finally:
        child.kill()
        child.wait()
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.2)
        assert not evidence.runnable()
        cpu, moved = evidence.sample()
        assert cpu >= 0 and moved >= 0
    finally:
        sleeper.kill()
        sleeper.wait()


def test_at_8_ranks_a_group_going_silent_in_mpi_one_by_one_does_not_outvote_the_idle_rank():
    """Seen in CI at 8 ranks on a loaded machine, bounds scaled: seven ranks entered mpi4py's
    allreduce (the GIL held while it polls) from the warm-up's sleep; six were silent while one was
    only late, and the six were named. The idle rank in its loader is the culprit."""
    clock = Clock()
    dog = HangWatchdog("auto", clock, size=8)
    dog.scale = 0.02  # as the corpus's JAXLAUNCH_WATCHDOG_SCALE: the split bound is 2.4 s
    others = [r for r in range(8) if r != 1]
    started(dog, {r: ("warmup", None) for r in range(8)})
    for r in others:
        dog.activity(r, activity("warmup", "own"))  # their last words: in the warm-up's sleep
    late, found = others[-1], None
    for i in range(15):
        clock.now += 2
        dog.activity(1, activity("loader", "own"))
        if i == 1:
            dog.activity(late, activity("warmup", "own"))  # one monitor got one more word out
        found = found or dog.check()
    assert found is not None and "rank 1 in its own code at prog.py:1 in loader" in found, found
    assert dog.verdict == {"rule": "split", "culprits": [1]}


def test_a_job_that_reports_and_stalls_past_hang_timeout_names_its_stopped_rank():
    """Seen in CI: the drill's hang trial on a job that reports, hang_timeout 5. The reports rule fired
    before the stopped rule's 5 s, named nobody, and the trial failed. The stopped (or late) rank is named."""
    clock = Clock()
    dog = HangWatchdog(5, clock, size=2)
    started(dog, {0: ("step", None), 1: ("step", None)})
    dog.progress(0, {"step": 1, "time": 1.0, "total": None, "step_seconds": 0.1})
    for _ in range(3):
        clock.now += 2
        dog.activity(0, activity("step", "xla"))
    dog.process_states({0: "S", 1: "T"})
    found = dog.check()
    assert found is not None and "rule: reports" in found and "rank 1 stopped or stopped telling" in found, found
    assert dog.verdict == {"rule": "reports", "culprits": [1]}
