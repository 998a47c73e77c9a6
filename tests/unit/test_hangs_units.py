"""Unit tests of the hang watchdog (launcher/supervisor/watchdog.py), the roll-call
(launcher/supervisor/rollcall.py), where a thread is (launcher/rank/stacks.py), a barrier's own
timeout, the spec's hang_timeout and the GPU's NCCL termination flag. The end-to-end runs are in
tests/e2e/test_hangs.py."""

import sys
import threading
import time

import pytest

from launcher.rank import stacks
from launcher.supervisor import rollcall
from launcher.supervisor.watchdog import CHECKPOINT_FACTOR, HangWatchdog, describe_setting


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def report(step, at, seconds=None):
    return {"step": step, "time": at, "total": None, "step_seconds": seconds}


# --- the watchdog ---------------------------------------------------------------------------

def test_the_watchdog_waits_for_the_first_report_then_fires_after_hang_timeout():
    clock = Clock()
    dog = HangWatchdog(10, clock)
    clock.now += 10_000  # start-up, however long: not counted
    assert dog.check() is None
    dog.progress(0, report(0, 1.0))
    clock.now += 9.5
    assert dog.check() is None
    dog.progress(1, report(0, 1.0))  # any rank's progress counts
    clock.now += 9.5
    assert dog.check() is None
    clock.now += 1
    assert dog.check().startswith("no rank made progress for 10 s (hang_timeout: 10 s; rule: reports); "
                                  "set hang_timeout: 5m in the spec")


def test_a_message_with_only_collective_arrivals_is_not_a_report():
    clock = Clock()
    dog = HangWatchdog(5, clock)
    dog.progress(0, {"arrivals": {"first": 1, "times": [1.0]}})
    clock.now += 100
    assert dog.check() is None and not dog.reported


def test_compiling_stops_the_clock_and_its_end_restarts_it():
    clock = Clock()
    dog = HangWatchdog(5, clock)
    dog.progress(0, report(0, 1.0))
    clock.now += 4
    dog.phase(1, "compiling")
    clock.now += 600  # a compile far longer than hang_timeout
    assert dog.check() is None
    dog.phase(1, None)
    clock.now += 4.9
    assert dog.check() is None
    clock.now += 0.2
    assert "no rank made progress for 5 s" in dog.check()


def test_a_checkpoint_gets_its_own_longer_allowance_and_arms_before_the_first_report():
    clock = Clock()
    dog = HangWatchdog(5, clock)
    dog.phase(0, "checkpoint")  # a restore at start-up
    clock.now += 5 * CHECKPOINT_FACTOR - 0.1
    assert dog.check() is None
    clock.now += 0.2
    assert "checkpoint save or restore" in dog.check() and f"{CHECKPOINT_FACTOR}x hang_timeout" in dog.check()
    dog.phase(0, None)  # the restore ended before the first report: start-up again
    clock.now += 1000
    assert dog.check() is None


def test_auto_is_the_floor_or_twenty_times_the_slowest_step():
    from launcher.spec.model import HANG_FLOOR_SECONDS, HANG_STEP_FACTOR

    clock = Clock()
    dog = HangWatchdog("auto", clock)
    dog.progress(0, {**report(3, 10.0, 0.5), "reports": [{"step": s, "time": t, "metrics": {}}
                                                          for s, t in ((1, 9.0), (2, 9.5), (3, 10.0))]})
    assert dog.limit() == HANG_FLOOR_SECONDS
    dog.progress(0, {**report(4, 100.0, 90.0), "reports": [{"step": 4, "time": 100.0, "metrics": {}}]})
    assert dog.limit() == HANG_STEP_FACTOR * 90.0  # the 90 s between step 3 and step 4
    clock.now += HANG_STEP_FACTOR * 90.0 + 1
    assert "hang_timeout: auto, 30 min now" in dog.check()


# --- the watchdog of programs that never report: the ranks' stacks -------------------------------

def activity(stack, moved=0, busy=0.0, where=None, kind=None, children_busy=0.0, io=0.0):
    """A rank's activity message; `kind` defaults from the stack's name (a monitor names the kind
    of a place it stood still at): "step", "barrier", "xla-step" wait for peers, others are its own."""
    if kind is None and not moved:
        kind = "xla" if stack in ("step", "xla-step", "next-step") else "barrier" if stack == "barrier" else "own"
    return {"time": 0.0, "stack": stack, "moved": moved, "busy": busy, "where": where or f"prog.py:1 in {stack}",
            "doing": kind, "children_busy": children_busy, "io": io}


def test_a_program_that_never_reports_is_ended_when_its_ranks_stall_apart_with_an_idle_culprit():
    """Rank 1 stuck in its loader (idle), ranks 0 and 2 waiting in XLA's collective at one place:
    HANG_SPLIT_SECONDS with auto, though no rank ever reported."""
    from launcher.spec.model import HANG_SPLIT_SECONDS

    clock = Clock()
    dog = HangWatchdog("auto", clock, size=3)
    for rank, stack in ((0, "step"), (1, "loader"), (2, "step")):
        dog.activity(rank, activity(stack, moved=1))
    assert dog.check() is None
    clock.now += HANG_SPLIT_SECONDS - 1
    for rank, stack in ((0, "step"), (1, "loader"), (2, "step")):
        dog.activity(rank, activity(stack, busy=1.0 if rank != 1 else 0.0))  # the waiting ranks spin in MPI
    assert dog.check() is None
    clock.now += 2
    found = dog.check()
    assert found.startswith(f"no rank made progress for {HANG_SPLIT_SECONDS + 1} s, and the ranks stand apart: "
                            "rank 1 in its own code at prog.py:1 in loader, using no CPU, doing no I/O and with "
                            "no busy child, while 2 rank(s) wait for them at prog.py:1 in step"), found
    assert "rule: split" in found and "set hang_timeout: 5m in the spec if this rank is meant to wait" in found
    assert dog.verdict == {"rule": "split", "culprits": [1]}
    assert dog.last_moved() == {0: HANG_SPLIT_SECONDS + 1, 1: HANG_SPLIT_SECONDS + 1, 2: HANG_SPLIT_SECONDS + 1}


def test_a_stack_that_moves_is_progress():
    clock = Clock()
    dog = HangWatchdog(10, clock, size=2)
    dog.activity(0, activity("a"))
    dog.activity(1, activity("step"))
    for _ in range(20):
        clock.now += 9
        dog.activity(0, activity("a", moved=1))  # rank 0 works: its stack changes between samples
        dog.activity(1, activity("step"))
        assert dog.check() is None
    for _ in range(5):  # both stand still, telling every 2 s as monitors do
        clock.now += 2
        dog.activity(0, activity("a"))
        dog.activity(1, activity("step"))
    clock.now += 0.5
    assert "stand apart" in dog.check()


def test_every_rank_at_one_place_gets_the_long_learned_bound_not_the_split_one():
    """One long XLA step (or a 5-minute evaluation) on every rank: the same stack everywhere. Not
    the split bound; the floor, then 20x the longest stall that ended by itself."""
    from launcher.spec.model import HANG_FLOOR_SECONDS, HANG_SPLIT_SECONDS, HANG_STEP_FACTOR

    clock = Clock()
    dog = HangWatchdog("auto", clock, size=2)
    for rank in (0, 1):
        dog.activity(rank, activity("xla-step", moved=1))
    clock.now += 300  # a 5-minute evaluation: no alarm
    assert dog.check() is None
    for rank in (0, 1):
        dog.activity(rank, activity("next-step", moved=1))  # it ended: 300 s learned
    assert dog.stall_limits() == (HANG_SPLIT_SECONDS, HANG_STEP_FACTOR * 300.0)
    clock.now += HANG_FLOOR_SECONDS + 1
    assert dog.check() is None
    clock.now += HANG_STEP_FACTOR * 300.0
    assert "every rank standing still at one place (hang_timeout: auto, 100 min; rule: together)" in dog.check()


def test_a_busy_rank_apart_from_the_rest_is_working_not_stalled():
    """Rank 0 of three evaluates alone (CPU busy) while ranks 1 and 2 wait at a barrier."""
    from launcher.spec.model import HANG_FLOOR_SECONDS, HANG_SPLIT_SECONDS

    clock = Clock()
    dog = HangWatchdog("auto", clock, size=3)
    def tell(moved=0):
        for rank, stack in ((0, "evaluate"), (1, "barrier"), (2, "barrier")):
            dog.activity(rank, activity(stack, moved=moved, busy=1.0 if rank == 0 else 0.0))

    tell(moved=1)
    clock.now += HANG_SPLIT_SECONDS * 3
    tell()
    assert dog.check() is None
    clock.now += HANG_FLOOR_SECONDS
    tell()
    assert "every rank standing still" in dog.check()


def test_two_ranks_the_one_waiting_for_its_peer_is_never_the_culprit_whatever_its_cpu():
    """An MPI wait spins (47-100% CPU, issue 51's finding 9): the rank in MPI waits for its peer and
    the idle rank in its own code is the culprit on the split bound; a busy rank in its own code
    (computing alone) is not."""
    from launcher.spec.model import HANG_SPLIT_SECONDS

    clock = Clock()
    dog = HangWatchdog("auto", clock, size=2)
    dog.activity(0, activity("allreduce", moved=1, busy=1.0))
    dog.activity(1, activity("loader", moved=1, busy=1.0))
    clock.now += HANG_SPLIT_SECONDS + 1
    dog.activity(0, activity("allreduce", busy=1.0, kind="mpi"))  # an MPI wait that spins
    dog.activity(1, activity("loader", busy=1.0))                 # computing alone: working
    assert dog.check() is None
    dog.activity(1, activity("loader", busy=0.0))
    found = dog.check()
    assert "and the ranks stand apart: rank 1 in its own code at prog.py:1 in loader" in found, found
    assert dog.verdict["culprits"] == [1]


def test_two_ranks_at_two_places_the_culprit_is_the_rank_whose_evidence_says_stuck_never_the_lower_number():
    """Issue 51's finding 4: with one rank on each side, the rank in its own code is named, whichever
    its number; before, a 1-vs-1 tie was broken by rank number and the roll-call said otherwise."""
    from launcher.spec.model import HANG_SPLIT_SECONDS

    for stuck, waiting in ((0, 1), (1, 0)):
        clock = Clock()
        dog = HangWatchdog("auto", clock, size=2)
        dog.activity(stuck, activity("busy.py:76", moved=1))
        dog.activity(waiting, activity("busy.py:77", moved=1))
        clock.now += HANG_SPLIT_SECONDS + 1
        dog.activity(stuck, activity("busy.py:76", kind="own"))
        dog.activity(waiting, activity("busy.py:77", kind="xla"))
        found = dog.check()
        assert f"stand apart: rank {stuck} in its own code at prog.py:1 in busy.py:76" in found, found
        assert dog.verdict == {"rule": "split", "culprits": [stuck]}
        roll = rollcall.roll_call(2, [state(stuck, "own", "busy.py:76 in main", "time.sleep"),
                                      state(waiting, "xla", "busy.py:77 in main", "step")])
        assert [c["rank"] for c in roll["culprits"]] == [stuck]


def test_two_ranks_waiting_for_peers_at_two_places_have_no_culprit_and_the_long_bound():
    """A deadlock between two collectives: each rank waits for the other. Nobody is blamed by number;
    the job is ended on the together bound, and the roll-call names no culprit."""
    from launcher.spec.model import HANG_FLOOR_SECONDS, HANG_SPLIT_SECONDS

    clock = Clock()
    dog = HangWatchdog("auto", clock, size=2)
    dog.activity(0, activity("allreduce", moved=1))
    dog.activity(1, activity("barrier", moved=1))
    clock.now += HANG_SPLIT_SECONDS * 2
    dog.activity(0, activity("allreduce", kind="mpi"))
    dog.activity(1, activity("barrier", kind="barrier"))
    assert dog.check() is None
    clock.now += HANG_FLOOR_SECONDS
    dog.activity(0, activity("allreduce", kind="mpi"))
    dog.activity(1, activity("barrier", kind="barrier"))
    assert "each waiting for a peer at a different place" in dog.check()
    assert dog.verdict == {"rule": "together", "culprits": []}
    roll = rollcall.roll_call(2, [state(0, "mpi", "a.py:1 in main", "comm.allreduce"),
                                  state(1, "barrier", "a.py:2 in main", "launcher.barrier")])
    assert roll["culprits"] == [] and "waits for a peer elsewhere" in roll["line"]


def test_compiling_and_checkpoints_count_for_stacks_as_for_reports():
    clock = Clock()
    dog = HangWatchdog(10, clock, size=2)
    dog.activity(0, activity("a", moved=1))
    dog.activity(1, activity("b", moved=1))
    dog.phase(1, "compiling")
    clock.now += 1000
    assert dog.check() is None
    dog.phase(1, "checkpoint")
    clock.now += 10 * CHECKPOINT_FACTOR - 1
    assert dog.check() is None
    clock.now += 2
    assert "40 s" in dog.check()  # the checkpoint's allowance, 4x hang_timeout


def test_stacks_are_judged_only_once_every_running_rank_has_spoken_and_a_finished_rank_is_left_out():
    from launcher.supervisor.watchdog import SILENT_SECONDS

    clock = Clock()
    dog = HangWatchdog(10, clock, size=2)
    dog.activity(0, activity("step", moved=1))
    clock.now += SILENT_SECONDS - 1
    dog.activity(0, activity("step"))
    assert dog.check() is None  # rank 1 has not said where it stands yet: start-up's grace
    dog.activity(1, activity("b"))
    clock.now += 11
    dog.activity(0, activity("step"))
    dog.activity(1, activity("b"))
    assert "stand apart" in dog.check()
    dog.finish(1)  # rank 1 returned from main: rank 0 alone, at one place
    assert dog.check() is not None and "every rank standing still" in dog.check()
    dog.finish(0)
    assert dog.check() is None


def test_a_rank_that_never_tells_is_named_after_the_start_up_grace():
    clock = Clock()
    dog = HangWatchdog(10, clock, size=2)
    dog.activity(0, activity("a", moved=1))
    for _ in range(6):
        clock.now += 2
        dog.activity(0, activity("a"))
    assert "rank 1 (never told) stopped telling where it stands" in dog.check()


def test_a_rank_stopped_before_it_ever_told_is_the_culprit_once_the_others_have_finished():
    """The drill's hang on a script: rank 0 SIGSTOPped 3 s in, before its first activity; rank 1 ran
    on and finished. Before, the watchdog waited for rank 0 to speak, for ever."""
    clock = Clock()
    dog = HangWatchdog(5, clock, size=2)
    dog.activity(1, activity("loop", moved=1))
    clock.now += 6
    dog.activity(1, activity("loop", moved=1))
    dog.finish(1)
    clock.now += 4
    assert dog.check() is None  # the stall is 4 s old
    clock.now += 2
    assert "rank 0 (never told) stopped telling where it stands" in dog.check()


def test_a_main_thread_that_sleeps_in_a_loop_gives_up_the_cpu_and_counts_as_moving():
    """A loop that mostly sleeps shows one stack at every sample; its voluntary context switches
    tell the monitor it moves (a thread blocked for good makes none)."""
    from launcher.rank.monitor import MOVE_SWITCHES, main_thread_switches

    native = threading.main_thread().native_id
    before = main_thread_switches(native)
    for _ in range(10):
        time.sleep(0.005)
    assert main_thread_switches(native) - before >= MOVE_SWITCHES


def test_off_never_fires():
    clock = Clock()
    dog = HangWatchdog(None, clock)
    dog.progress(0, report(0, 1.0))
    clock.now += 1e9
    assert dog.check() is None and dog.limit() is None
    assert describe_setting(None).startswith("off")


# --- the roll-call ----------------------------------------------------------------------------

def state(rank, kind, where, detail=None, host="n0"):
    return {"rank": rank, "host": host, "place": {"kind": kind, "where": where, "detail": detail}, "where": where}


def test_the_roll_call_names_the_rank_that_is_elsewhere_and_its_node():
    states = [state(0, "xla", "/a/train.py:88 in main", "train_step", "n0"),
              state(1, "xla", "/a/train.py:88 in main", "train_step", "n1"),
              state(2, "own", "/a/loader.py:41 in read_batch", "time.sleep", "n2"),
              state(3, "xla", "/a/train.py:88 in main", "train_step", "n3")]
    roll = rollcall.roll_call(4, states)
    assert roll["line"] == ("3 of 4 ranks wait in XLA (train.py:88 in main, calling train_step); rank 2 on n2 is "
                            "elsewhere: in its own code at loader.py:41 in read_batch (time.sleep)")
    assert [c["rank"] for c in roll["culprits"]] == [2]
    assert rollcall.culprit_nodes(roll) == {"n2": "rank 2 held the job up (in its own code at loader.py:41 in "
                                                  "read_batch (time.sleep))"}


def test_a_rank_that_does_not_answer_or_left_is_named_too():
    states = [state(0, "barrier", "/a/t.py:9 in main", "launcher.barrier")]
    roll = rollcall.roll_call(3, states, finished_ranks={2})
    assert [c["rank"] for c in roll["culprits"]] == [1, 2]
    assert "rank 1 did not answer" in roll["line"] and "rank 2 had left its entrypoint" in roll["line"]


def test_nobody_is_blamed_when_every_rank_waits_at_one_place_or_none_waits():
    same = [state(r, "xla", "/a/t.py:5 in main", "step") for r in range(2)]
    roll = rollcall.roll_call(2, same)
    assert roll["culprits"] == [] and "no rank is elsewhere" in roll["line"]
    busy = [state(r, "own", f"/a/t.py:{r} in main") for r in range(2)]
    roll = rollcall.roll_call(2, busy)
    assert roll["culprits"] == [] and roll["line"].startswith("no rank waits for a peer")
    assert rollcall.culprit_nodes(roll) == {}


def test_the_roll_call_takes_the_largest_waiting_group_and_on_a_tie_the_one_with_the_lowest_rank():
    """Issue 33's review: the planted bug 'take the smallest waiting group' went unnoticed."""
    states = [state(0, "barrier", "/a/t.py:9 in main", "launcher.barrier"),
              *(state(r, "xla", "/a/t.py:5 in main", "step") for r in (1, 2, 3)),
              state(4, "own", "/a/loader.py:41 in read_batch", "time.sleep")]
    roll = rollcall.roll_call(5, states)
    assert roll["waiting"]["kind"] == "xla" and roll["waiting"]["ranks"] == [1, 2, 3]
    # Rank 0 waits at a barrier: elsewhere, but for a peer; the culprit is the rank in its own code.
    assert [c["rank"] for c in roll["culprits"]] == [4]
    assert "rank 0 on n0 waits for a peer elsewhere" in roll["line"]
    tie = [state(0, "own", "/a/t.py:2 in main"), state(1, "barrier", "/a/t.py:9 in main", "launcher.barrier"),
           state(2, "xla", "/a/t.py:5 in main", "step")]
    roll = rollcall.roll_call(3, tie)
    assert roll["waiting"]["ranks"] == [1] and [c["rank"] for c in roll["culprits"]] == [0]


def test_the_roll_call_reads_a_rank_state_without_a_place_from_its_collective():
    old = {"rank": 0, "host": "n0", "where": "/a/t.py:3 in main", "waiting_in": {"seq": 2, "name": "allreduce"}}
    roll = rollcall.roll_call(2, [old, state(1, "own", "/a/t.py:7 in main")])
    assert roll["waiting"]["kind"] == "collective" and [c["rank"] for c in roll["culprits"]] == [1]


def test_failure_json_of_a_hang_carries_the_roll_call_and_its_summary_names_the_culprit():
    from launcher.supervisor import root_cause

    states = [state(0, "xla", "/a/t.py:5 in main", "step", "n0"), state(1, "own", "/a/l.py:2 in read", None, "n1")]
    failure = root_cause.build_failure(
        state="TIMEOUT", reason="hang", num_processes=2, rank_errors=[], abort_requests=[], launcher_reports=[],
        reports_every_task=False, finished_ranks=set(), started_ranks={0: "n0", 1: "n1"}, rank_states=states,
        log_tail=lambda rank: "", launcher_exit_code=None, attempt=0, seen_at=time.time(),
        detail="no rank made progress for 6 s (hang_timeout: 6 s)")
    assert failure["summary"] == ("no rank made progress for 6 s (hang_timeout: 6 s); rank 1 on n1 held it up, "
                                  "in its own code at l.py:2 in read")
    assert failure["hang"]["roll_call"]["culprits"][0]["rank"] == 1
    assert root_cause.summary_lines(failure)[1].startswith("roll-call: 1 of 2 ranks waits in XLA")


# --- where a thread is (real threads) --------------------------------------------------------

def _place_of_blocked(target):
    """The place of a thread blocked in `target` (a function of this file). What the thread imports
    is imported by the caller first: on a loaded machine importing JAX outlasts any fixed wait."""
    ready, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=target, args=(ready, release), daemon=True)
    thread.start()
    assert ready.wait(120), "the thread never reached the call it blocks in"
    time.sleep(0.2)  # from ready.set() into that call: a few bytecodes
    try:
        return stacks.place(thread.ident)
    finally:
        release.set()
        thread.join(5)


def _waits_on_a_lock(ready, release):
    lock = threading.Lock()
    lock.acquire()
    ready.set()
    while not release.is_set():
        lock.acquire(timeout=0.05)


def _waits_in_a_launcher_barrier(ready, release):
    from launcher.rank.collectives import ops

    def barrier(name="x", timeout=None):  # a stand-in with the collectives module's file and name
        ready.set()
        release.wait(120)  # the test releases it; a timeout only ends a thread the test lost

    barrier.__code__ = barrier.__code__.replace(co_filename=ops.__file__, co_name="barrier")
    barrier("epoch")


def test_place_names_the_call_a_job_line_makes(monkeypatch):
    monkeypatch.setattr(stacks, "is_own_code", lambda filename: filename == __file__)
    place = _place_of_blocked(_waits_on_a_lock)
    assert place["kind"] == "own" and place["detail"] == "lock.acquire"
    assert place["where"].startswith(f"{__file__}:") and place["where"].endswith("in _waits_on_a_lock")
    import launcher.rank.collectives.ops  # noqa: F401  (imports JAX: done before the thread's clock starts)
    place = _place_of_blocked(_waits_in_a_launcher_barrier)
    assert place["kind"] == "barrier" and place["detail"] == "launcher.barrier"


def test_a_jitted_function_is_a_wait_in_xla():
    jax = pytest.importorskip("jax")
    step = jax.jit(lambda x: x + 1)
    assert stacks._kind_of_callable(step, "step") == ("xla", "step")
    assert stacks._kind_of_callable(time.sleep, "time.sleep") == ("own", "time.sleep")


def test_compiling_is_a_phase_and_a_checkpoint_read_too():
    assert stacks._kind_of_frame(f"{sys.prefix}/lib/python3.11/site-packages/jax/_src/compiler.py",
                                 "backend_compile_and_load")[0] == "compiling"
    assert stacks._kind_of_frame(stacks.LAUNCHER_DIR + "rank/checkpoints/manager.py", "load") == ("checkpoint", "load")
    assert stacks._kind_of_frame(stacks.LAUNCHER_DIR + "rank/checkpoints/manager.py", "_collective")[0] == "collective"
    assert stacks._kind_of_frame("/x/site-packages/jax/experimental/multihost_utils.py",
                                 "sync_global_devices")[0] == "barrier"


def test_a_rank_inside_should_stop_waits_for_its_peers():
    # its allreduce is C (mpi4py): the innermost Python frame is should_stop itself. Before, the rank
    # counted as "in its own code", and a peer hung elsewhere was not named (the drill's repeat fault).
    assert stacks._kind_of_frame(stacks.LAUNCHER_DIR + "rank/preemption.py", "should_stop") == \
        ("collective", "ctx.should_stop")
    assert stacks._kind_of_frame(stacks.LAUNCHER_DIR + "rank/preemption.py", "_on_usr2") is None


def test_an_installed_package_in_dist_packages_is_a_library_not_the_jobs_code():
    """Debian's and Ubuntu's Pythons install packages into dist-packages (issue 55); this one lies
    outside every library root of this interpreter, so only its folder's name says so."""
    for folder in ("dist-packages", "site-packages"):
        assert not stacks.is_own_code(f"/opt/python3/{folder}/tqdm/std.py")
    assert stacks.is_own_code("/opt/python3/job/tqdm/std.py")
    frames = [("/opt/python3/dist-packages/tqdm/std.py", 1180, "__iter__"), ("/job/train.py", 40, "main")]
    assert stacks.innermost_place(frames) == "/job/train.py:40 in main"


# --- a barrier's own timeout, through the rank's monitor ---------------------------------------

class Recorder:
    def __init__(self):
        self.sent = []

    def send(self, kind, record):
        self.sent.append((kind, record))


def test_a_barrier_past_its_timeout_asks_the_supervisor_to_stop_the_job(tmp_path):
    from launcher.rank.monitor import RankMonitor
    from launcher.rank.tracker import CollectiveTracker

    tracker = CollectiveTracker()
    monitor = RankMonitor(run=None, rank=0, size=2, collective_timeout=1800, tracker=tracker)
    recorder = Recorder()
    monitor.send = recorder.send
    seq = tracker.start("barrier 'epoch'")
    tracker.enter(seq, "barrier 'epoch'", timeout=0.3)
    monitor.check()
    assert not any(kind == "abort" for kind, _ in recorder.sent)
    time.sleep(0.4)
    monitor.check()
    aborts = [record for kind, record in recorder.sent if kind == "abort"]
    assert aborts and aborts[0].reason == "collective_timeout"
    assert "barrier 'epoch' #1 on rank 0 waited 0 s, past its timeout=0.3 s" == aborts[0].message
    tracker.leave()
    assert tracker.blocking_timeout is None


def test_a_ranks_where_for_the_watchdog_is_the_innermost_frame_of_its_own_code(monkeypatch):
    """The monitor's activity message (the watchdog's stall place) and its state (logs/rank-N.state.json) name
    the frame of the job's own code nearest the library, not the outer main (issue 55)."""
    from launcher.rank import monitor as rank_monitor
    from launcher.rank.tracker import CollectiveTracker

    frames = [("/opt/python3/site-packages/jax/_src/pjit.py", 300, "cache_miss"),  # innermost first
              ("/job/model.py", 12, "forward"), ("/job/train.py", 90, "main")]
    monkeypatch.setattr(stacks, "stack_of", lambda thread_id: frames)
    monkeypatch.setattr(rank_monitor, "ACTIVITY_SECONDS", 0)  # an activity message at the first poll
    monitor = rank_monitor.RankMonitor(run=None, rank=1, size=2, collective_timeout=None, tracker=CollectiveTracker())
    recorder = Recorder()
    monitor.send = recorder.send
    monitor.report_phase()
    assert [record.where for kind, record in recorder.sent if kind == "activity"] == ["/job/model.py:12 in forward"]
    state = monitor.state("stop")
    assert (state["where"], state["place"]["where"]) == ("/job/model.py:12 in forward",) * 2


def test_barrier_refuses_a_timeout_that_is_not_positive():
    from launcher.rank.collectives import ops

    with pytest.raises(ValueError, match="positive seconds"):
        ops.barrier("x", timeout=0)


def test_the_monitor_never_waits_for_an_unfinished_metric():
    from launcher.rank.progress import ProgressReporter

    class Pending:
        ready = False

        def is_ready(self):
            return self.ready

    loss = Pending()
    reporter = ProgressReporter(rank=0)
    reporter.report(0, loss=1.0)
    reporter.report(1, loss=loss)
    message = reporter.take()
    assert [r["step"] for r in message["reports"]] == [0] and not reporter.pending
    loss.ready = True
    assert reporter.pending and [r["step"] for r in reporter.take()["reports"]] == [1]


# --- the spec and the GPU's flags --------------------------------------------------------------

def test_hang_timeout_is_auto_by_default_and_takes_durations_or_null(write_spec):
    from launcher.spec.load import load_spec

    assert load_spec(write_spec("name: x\nentrypoint: m:f\n")).hang_timeout == "auto"
    assert load_spec(write_spec("name: x\nentrypoint: m:f\n")).collective_timeout == 1800
    assert load_spec(write_spec("name: x\nentrypoint: m:f\nhang_timeout: 5m\n")).hang_timeout == 300
    assert load_spec(write_spec("name: x\nentrypoint: m:f\nhang_timeout: null\n")).hang_timeout is None


def test_a_wrong_hang_timeout_names_the_line_and_the_fix(write_spec):
    from conftest import jaxlaunch

    path = write_spec("name: x\nentrypoint: m:f\nhang_timeout: soon\n")
    from click.testing import CliRunner

    from launcher.cli import main

    result = CliRunner().invoke(main, ["explain", str(path)])
    assert result.exit_code == 2 and f"{path}:3: hang_timeout" in result.output and "'auto'" in result.output
    del jaxlaunch


def test_explain_shows_the_limits_in_force(write_spec):
    from launcher.cli.explain_table import watchdog_lines
    from launcher.spec.load import load_spec

    spec = load_spec(write_spec("name: x\nentrypoint: m:f\nhang_timeout: 2m\n"))
    assert watchdog_lines(spec) == [
        "hang watchdog: 2 min; a checkpoint save or restore gets 8 min; a compile that stands still gets 30 min "
        "(or 4x the longest so far); a rank stopped 5 s or silent 10 s is a culprit",
        "progress: each ctx.report() and, in a job that never reports (most programs), each rank's stack moving",
        "a launcher collective may wait 30 min; the whole job has no time limit (timeout: null)"]


def test_the_nccl_termination_timeout_follows_hang_timeout_unless_the_user_set_it():
    from launcher.rank.topology import device_environment

    env = device_environment("gpu", 1, 0, {}, hang_timeout=300)
    assert env["XLA_FLAGS"] == ("--xla_gpu_nccl_termination_timeout_seconds=600 "
                                "--xla_gpu_execution_terminate_timeout=600s")
    assert "=1200" in device_environment("gpu", 1, 0, {}, hang_timeout="auto")["XLA_FLAGS"]
    mine = {"XLA_FLAGS": "--xla_gpu_nccl_termination_timeout_seconds=42 --xla_gpu_execution_terminate_timeout=5m"}
    assert device_environment("gpu", 1, 0, mine, hang_timeout=300)["XLA_FLAGS"] == mine["XLA_FLAGS"]
    assert "XLA_FLAGS" not in device_environment("gpu", 1, 0, {}, hang_timeout=None)
    assert "nccl" not in device_environment("cpu", 1, 0, {}, hang_timeout=300)["XLA_FLAGS"]


# --- JAX's runtime: a bounded shutdown -------------------------------------------------------

def test_a_shutdown_that_never_returns_is_abandoned_after_its_time(monkeypatch):
    import types

    from launcher.rank import jax_runtime

    calls = []
    never = threading.Event()
    fake = types.SimpleNamespace(distributed=types.SimpleNamespace(
        is_initialized=lambda: True, shutdown=lambda: (calls.append(1), never.wait(30))))
    monkeypatch.setitem(sys.modules, "jax", fake)
    monkeypatch.setattr(jax_runtime, "SHUTDOWN_ABANDONED", False)
    started = time.monotonic()
    assert jax_runtime.shutdown_jax_distributed(timeout=0.3) >= 0.3
    assert time.monotonic() - started < 5 and calls == [1]
    assert jax_runtime.SHUTDOWN_ABANDONED  # the rank's exit then skips JAX's exit handler
    never.set()


def test_no_shutdown_without_a_runtime(monkeypatch):
    import types

    from launcher.rank import jax_runtime

    fake = types.SimpleNamespace(distributed=types.SimpleNamespace(is_initialized=lambda: False))
    monkeypatch.setitem(sys.modules, "jax", fake)
    assert jax_runtime.shutdown_jax_distributed() is None


# --- the supervisor's note for a job that never reports --------------------------------------

def test_a_job_that_has_not_reported_is_told_once_that_the_watchdog_follows_its_stacks(write_spec, tmp_path):
    import types

    from launcher.rundir import RunDirectory
    from launcher.spec.load import load_spec
    import importlib

    supervise = importlib.import_module("launcher.supervisor.supervise")

    spec = load_spec(write_spec("name: x\nentrypoint: m:f\nprocesses_per_node: 2\n"))
    said = []
    supervisor = supervise.Supervisor(spec, RunDirectory(tmp_path / "run"), [], {}, echo=said.append)
    supervisor.watchdog = HangWatchdog(spec.hang_timeout)
    started = [{"rank": 0, "time": time.time()}, {"rank": 1, "time": time.time()}]
    supervisor.channel = types.SimpleNamespace(started=lambda: started)
    supervisor._note_unarmed_watchdog()
    assert said == []  # not in the first minute
    for record in started:
        record["time"] -= importlib.import_module("launcher.supervisor.attempt").UNARMED_NOTE_SECONDS + 1
    supervisor._note_unarmed_watchdog()
    supervisor._note_unarmed_watchdog()
    assert len(said) == 1 and "no ctx.report() from the job in its first 60 s" in said[0]
    assert "the hang watchdog follows the ranks' stacks" in said[0] and "2 min when the ranks stall apart" in said[0]


def _read_from_another_thread(read):
    """read() called on another thread while the main thread waits (as a rank's does in XLA)."""
    ready, release = threading.Event(), threading.Event()
    seen = {}

    def watch():
        ready.wait(5)
        try:
            seen["value"] = read()
        except BaseException as error:  # noqa: BLE001  (raised again on the main thread)
            seen["error"] = error
        finally:
            release.set()

    thread = threading.Thread(target=watch)
    thread.start()
    ready.set()
    release.wait(5)  # the main thread waits here while the other reads its stack
    thread.join(5)
    if "error" in seen:
        raise seen["error"]
    return seen["value"]


@pytest.mark.parametrize("collecting", [True, False], ids=["collector-on", "collector-off"])
def test_the_monitors_poll_reads_the_main_threads_stack_without_faulthandler(monkeypatch, collecting):
    """faulthandler.dump_traceback(all_threads=True) from the monitor thread walked the thread
    states without their lock and killed a rank with SIGSEGV in mpi4jax's test suite (issue 51,
    finding 10). stack_of reads through sys._current_frames() with the collector off while it
    makes frame objects, and leaves the collector as the program had it."""
    import faulthandler
    import gc

    main = threading.main_thread().ident

    def no_dump(*args, **kwargs):
        raise AssertionError("faulthandler.dump_traceback called")

    collector_while_reading = []
    current_frames = sys._current_frames

    def frames_with_the_collector_off():
        collector_while_reading.append(gc.isenabled())
        return current_frames()

    monkeypatch.setattr(faulthandler, "dump_traceback", no_dump)
    monkeypatch.setattr(sys, "_current_frames", frames_with_the_collector_off)
    was = gc.isenabled()
    (gc.enable if collecting else gc.disable)()
    try:
        stack, phase, where = _read_from_another_thread(
            lambda: (stacks.stack_of(main), stacks.phase(main), stacks.where_is(main)))
        assert gc.isenabled() is collecting
    finally:
        (gc.enable if was else gc.disable)()
    assert stack[0][2] == "wait" and any(f[2] == "_read_from_another_thread" for f in stack)
    assert any(f[2].startswith("test_the_monitors_poll_reads") for f in stack)
    assert all(isinstance(line, int) and filename for filename, line, _ in stack)
    assert phase is None and "in _read_from_another_thread" in where
    assert collector_while_reading and not any(collector_while_reading)


def test_stack_of_keeps_the_innermost_frames_and_knows_no_thread_it_cannot_find():
    inside, release = threading.Event(), threading.Event()

    def deep(depth):
        if depth:
            return deep(depth - 1)
        inside.set()
        release.wait(10)

    thread = threading.Thread(target=deep, args=(stacks.MAX_FRAMES + 20,))
    thread.start()
    try:
        inside.wait(10)
        stack = stacks.stack_of(thread.ident)
    finally:
        release.set()
        thread.join(10)
    assert len(stack) == stacks.MAX_FRAMES
    assert stack[0][2] == "wait" and stack[-1][2] == "deep"  # the innermost ones, not the outermost
    assert stacks.stack_of(1) == []  # no thread by that id


def test_a_rank_whose_c_threads_enter_python_survives_its_stacks_being_read():
    """Issue 51, finding 10: C threads that enter Python (mpi4jax's debug log on XLA's threads; here
    ctypes callbacks on short-lived pthreads) make a thread state each time, outside the GIL,
    while stack_of reads the main thread's stack again and again (tests/thread_state_race.py).
    With faulthandler's dump as the reader, the process died of SIGSEGV in 12 runs of 12, within
    0.9 s of its start; now it ends."""
    import os
    import subprocess
    from pathlib import Path

    tests = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, str(tests / "thread_state_race.py"), "4", "8"], cwd=tests.parent,
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "PYTHONPATH": str(tests.parent)})
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    reads, made = (int(word) for word in result.stdout.split() if word.isdigit())
    assert reads > 1000 and made > 100, result.stdout
    assert result.stdout.rstrip().endswith("the main thread at main_thread_waits"), result.stdout


def test_the_stacks_a_rank_logs_when_stopped_are_every_threads_in_faulthandlers_words():
    """report_state writes them into the rank's log: read as stack_of reads (a dump of every thread
    by faulthandler from the monitor thread could crash the rank as the poll did)."""
    text = _read_from_another_thread(stacks.all_stacks)
    main = threading.main_thread().ident
    assert f"Thread 0x{main:016x} (most recent call first):" in text
    assert "Current thread 0x" in text and "in _read_from_another_thread" in text
    block = text.split(f"Thread 0x{main:016x} (most recent call first):\n")[1].split("\n\n")[0]
    assert block.splitlines()[0].startswith('  File "') and block.splitlines()[0].endswith(" in wait")


def test_a_hang_leaves_the_culprits_node_behind_only_where_the_allocation_can_do_without_it(write_spec, tmp_path):
    """On Slurm a requeue without a node the partition cannot spare would wait in the queue for
    good (seen on the 2-node partition of the test cluster): then the job ends as before."""
    import importlib
    import types

    from launcher.rundir import RunDirectory
    from launcher.spec.load import load_spec
    from launcher.supervisor.allocation import Allocation

    supervise = importlib.import_module("launcher.supervisor.supervise")
    asked = []

    class Cluster(Allocation):
        spare = True

        def can_leave_nodes_behind(self, bad=()):
            asked.append(set(bad))
            return self.spare

    spec = load_spec(write_spec("name: x\nentrypoint: m:f\nnodes: 2\n"))
    cluster = Cluster()
    supervisor = supervise.Supervisor(spec, RunDirectory(tmp_path / "run"), [], {}, allocation=cluster)
    supervisor.channel = types.SimpleNamespace(started=lambda: [{"host": "n1"}, {"host": "n2"}])
    failure = {"hang": {"roll_call": {"culprits": [{"rank": 1, "host": "n2", "why": "in its own code at l.py:2"}]}}}
    assert list(supervisor._hang_culprit_nodes("hang", failure)) == ["n2"] and asked == [{"n2"}]
    cluster.spare = False
    assert supervisor._hang_culprit_nodes("collective_timeout", failure) == {}
    assert supervisor._hang_culprit_nodes("timeout", failure) == {}  # the job's time is spent: it ends
    everyone = {"hang": {"roll_call": {"culprits": [{"rank": 0, "host": "n1", "why": "x"},
                                                    {"rank": 1, "host": "n2", "why": "y"}]}}}
    cluster.spare = True
    assert supervisor._hang_culprit_nodes("hang", everyone) == {}  # never every node of the job


def test_status_says_how_long_ago_each_rank_of_a_running_job_last_made_progress(tmp_path):
    """Before: `status` showed 'step 4/1000 (0%), 7.87 steps/s, ETA 2 min 06 s' long after the stall,
    with no sign of it. The supervisor writes each rank's still time into status.json (the watchdog's
    view); a rank still for 30 s or more is shown."""
    import types

    from launcher.cli.status_table import still_line
    from launcher.rundir import RunDirectory
    from launcher.states import JobState

    run = RunDirectory(tmp_path / "run")
    run.path.mkdir()
    job = types.SimpleNamespace(run=run, state=lambda: JobState.RUNNING)
    run.update_status(state=JobState.RUNNING, still={"0": 1.0, "1": 20.0}, still_at=time.time())
    assert still_line(job) is None  # nobody still for 30 s yet
    run.update_status(still={"0": 1.0, "1": 20.0}, still_at=time.time() - 15)  # written 15 s ago
    assert still_line(job) == "last progress: rank 0 16 s ago, rank 1 35 s ago"


def test_a_rank_that_stopped_telling_counts_as_idle():
    """A SIGSTOPped rank (the drill's hang) sends nothing more: its last busy figure must not hide it."""
    from launcher.spec.model import HANG_SPLIT_SECONDS

    clock = Clock()
    dog = HangWatchdog("auto", clock, size=2)
    dog.activity(0, activity("step", moved=1))
    dog.activity(1, activity("loader", moved=1, busy=1.0))  # its last word, then SIGSTOP
    clock.now += HANG_SPLIT_SECONDS + 1
    dog.activity(0, activity("step"))
    assert "rank 1 (last at prog.py:1 in loader) stopped telling where it stands" in dog.check()


def test_xla_takes_the_execution_watchdog_flag_as_rendered(tmp_path):
    """XLA's flag parser ends the process on a value it cannot read (a bare 1200 is refused): the
    rendered flag is run through a real JAX on this machine's CPU, where XLA still parses it."""
    import subprocess

    from launcher.rank.topology import gpu_device_flags

    flags = gpu_device_flags("", "auto")
    assert "--xla_gpu_execution_terminate_timeout=1200s" in flags.split()
    done = subprocess.run([sys.executable, "-c", "import jax.numpy as jnp; print(float(jnp.ones(2).sum()))"],
                          env={**__import__("os").environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "2.0", done.stderr[-2000:]
