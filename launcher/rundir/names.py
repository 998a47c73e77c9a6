"""Every name in a run directory, spelled once. RunDirectory (launcher/rundir/__init__.py) builds its
paths from these (ask it for a path); a module that needs a name itself (a function job's files,
relative to the run directory, in launcher/executor.py) imports it from here. This module imports
nothing. tests/unit/test_rundir_names.py fails when a launcher module outside launcher/rundir/
spells one of these file names itself."""

# In the run directory itself.
SPEC_FILE = "spec.json"               # the validated spec the ranks read
STATUS_FILE = "status.json"           # state, exit code, times (launcher/states.py: StatusRecord)
RESULT_FILE = "result.json"           # what rank 0's entrypoint returned (launcher/rundir/results.py)
ARRAYS_FILE = "result.npz"            # its arrays
RESULT_PICKLE = "result.pkl"          # what JSON cannot hold, pickled
RESULT_SIGNATURE = "result.pkl.sig"   # its signature with the owner's key (launcher/owner_key.py)
FAILURE_FILE = "failure.json"         # the root cause (launcher/supervisor/root_cause.py)
METRICS_FILE = "metrics.jsonl"        # ctx.report's progress (launcher/rundir/metrics.py)
EVENTS_FILE = "events.jsonl"          # the run's timeline
ENVIRONMENT_FILE = "environment.json"  # what ran (launcher/provenance.py)
DIFF_FILE = "git.diff"                # the job folder's uncommitted changes
PREFLIGHT_FILE = "preflight.json"     # every rank's software and devices (launcher/rank/preflight.py)
OUTPUT_LOG = "output.log"             # a background local run's (or a local array task's) combined output
CODE_FOLDER = "code"                  # the job's code, with snapshot: true
CHECKPOINTS_FOLDER = "checkpoints"    # ctx.checkpoints (launcher/rank/checkpoints/)
FUNCTION_FOLDER = "function"          # a function job's pickled call (launcher/rank/function_job.py):
CALL_FILE = "call.pkl"                #   function/call.pkl: cloudpickle of (fn, args, kwargs)
CALL_RECORD = "call.json"             #   function/call.json: versions, sys.path, call.pkl's signature

# In logs/.
LOGS_FOLDER = "logs"
LAUNCHER_LOG = "launcher.log"         # what mpirun/srun printed themselves
CONTROL_RECORDS = "control.json"      # the ranks' messages of this attempt (launcher/supervisor/channel.py)
RANK_LOG = "rank-{rank}.log"          # everything rank N printed
RANK_ERROR = "rank-{rank}.error"      # rank N's traceback
RANK_ERROR_RECORD = "rank-{rank}.error.json"  # the same as data
RANK_STATE = "rank-{rank}.state.json"  # where rank N was when the job was stopped

RANK_FILES = (RANK_LOG, RANK_ERROR, RANK_ERROR_RECORD, RANK_STATE)


def every_rank(template: str) -> str:
    """The glob of a per-rank name: 'rank-*.log' for RANK_LOG."""
    return template.format(rank="*")


# The file names (not folders), per-rank ones as globs: what no module outside launcher/rundir/ spells.
FILE_NAMES = frozenset({
    SPEC_FILE, STATUS_FILE, RESULT_FILE, ARRAYS_FILE, RESULT_PICKLE, RESULT_SIGNATURE, FAILURE_FILE,
    METRICS_FILE, EVENTS_FILE, ENVIRONMENT_FILE, DIFF_FILE, PREFLIGHT_FILE, OUTPUT_LOG, CALL_FILE,
    CALL_RECORD, LAUNCHER_LOG, CONTROL_RECORDS, *(every_rank(t) for t in RANK_FILES)})
FOLDER_NAMES = frozenset({CODE_FOLDER, CHECKPOINTS_FOLDER, FUNCTION_FOLDER, LOGS_FOLDER})
