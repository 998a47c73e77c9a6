"""Sweeps without Slurm: declaring and expanding them, validation of every configuration, the job
array scripts (golden file, and what bash really runs), and a local sweep end to end under mpirun.
The Slurm arrays themselves are in test_slurm_sweep.py."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import JOBS, jaxlaunch
from launcher.cli import main
from launcher.errors import SpecError
from launcher.slurm import scheduler
from launcher.slurm.render import render_array_script
from launcher.spec import JobSpec, load_spec
from launcher.sweeps.array import plan_arrays
from launcher.sweeps.directory import SweepDirectory, task_folder
from launcher.sweeps.plan import expand_range, load_job_or_sweep

GOLDEN = Path(__file__).parent / "golden"
BASE = """\
name: sw
entrypoint: job.py:main
params:
  lr: 0.1
"""


@pytest.fixture
def spec_file(tmp_path):
    (tmp_path / "job.py").write_text("def main(ctx):\n    return {'lr': ctx.params['lr']}\n")

    def write(extra=""):
        path = tmp_path / "sweep.yaml"
        path.write_text(BASE + extra)
        return path
    return write


def labels(sweep):
    return [c.values for c in sweep.configurations]


def test_no_sweep_gives_the_one_job(spec_file):
    assert isinstance(load_job_or_sweep(spec_file()), JobSpec)


def test_flags_give_the_cartesian_product_last_key_fastest(spec_file):
    sweep = load_job_or_sweep(spec_file(), [], ["params.lr=0.1,0.01", "params.seed=range(3)"])
    assert sweep.keys == ["params.lr", "params.seed"]
    assert labels(sweep) == [{"params.lr": lr, "params.seed": s} for lr in (0.1, 0.01) for s in (0, 1, 2)]
    assert [c.spec.params for c in sweep.configurations][4] == {"lr": 0.01, "seed": 1}
    assert [c.index for c in sweep.configurations] == list(range(6))


def test_spec_section_dotted_or_nested_and_a_flag_replaces_one_key_in_place(spec_file):
    path = spec_file("sweep:\n  params.lr: [0.1, 0.2]\n  params:\n    seed: range(0, 2)\n  nodes: [1, 2]\n")
    assert load_job_or_sweep(path).keys == ["params.lr", "params.seed", "nodes"]
    sweep = load_job_or_sweep(path, [], ["params.seed=7,8,9"])
    assert sweep.keys == ["params.lr", "params.seed", "nodes"]  # the flag's key keeps its place
    assert len(sweep.configurations) == 2 * 3 * 2
    assert {c.values["params.seed"] for c in sweep.configurations} == {7, 8, 9}
    assert {c.spec.nodes for c in sweep.configurations} == {1, 2}


def test_values_are_typed_like_set(spec_file):
    sweep = load_job_or_sweep(spec_file(), [], ["params.x=1,1.5,true,abc,[1,2],'a,b',null"])
    assert [c.values["params.x"] for c in sweep.configurations] == [1, 1.5, True, "abc", [1, 2], "a,b", None]


@pytest.mark.parametrize("text, values", [
    ("range(3)", [0, 1, 2]), ("range(1, 7, 2)", [1, 3, 5]), ("range(5, 0, -2)", [5, 3, 1]),
    ("range(0, 1, 0.1)", [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]),  # exact decimals
    ("range(0.5, 2)", [0.5, 1.5]),
])
def test_ranges_like_hydra(text, values):
    got = expand_range(text, "here", 1000)
    assert got == values and [type(v) for v in got] == [type(v) for v in values]


@pytest.mark.parametrize("flag, message", [
    ("params.lr=range(0, 0)", "is empty (stop is excluded)"),
    ("params.lr=range(0, 5, 0)", "the step is 0"),
    ("params.lr=range(a, 5)", "'a' is not a number"),
    ("params.lr=range(1,2,3,4)", "range takes (stop), (start, stop) or (start, stop, step)"),
    ("params.lr=1,2,1", "1 is listed twice"),
    ("params.lr=1,,2", "an empty value"),
    ("params.lr", "expected KEY=V1,V2,..."),
    ("sweep_limit=1,2", "sweep_limit cannot be swept"),
    ("run_dir=a,b", "run_dir cannot be swept"),
    ("params..x=1,2", "is not a key"),
])
def test_bad_declarations(spec_file, flag, message):
    with pytest.raises(SpecError) as error:
        load_job_or_sweep(spec_file(), [], [flag])
    assert message in str(error.value) and str(error.value).startswith(f"--sweep {flag}")


def test_bad_spec_section_names_file_and_line(spec_file):
    path = spec_file("sweep:\n  params.lr: 0.5\n")
    with pytest.raises(SpecError, match=rf"^{path}:6: sweep: params.lr: 0.5 is a single value"):
        load_job_or_sweep(path)
    path = spec_file("sweep: [1, 2]\n")
    with pytest.raises(SpecError, match=rf"^{path}:5: sweep: expected a mapping"):
        load_job_or_sweep(path)


def test_an_invalid_configuration_names_its_index_key_value_and_origin(spec_file):
    path = spec_file("sweep:\n  nodes: [1, 0]\n")
    with pytest.raises(SpecError) as error:
        load_job_or_sweep(path, [], ["params.seed=1,2"])
    text = str(error.value)
    assert text.startswith("the sweep has invalid configurations; nothing was run or submitted.\n")
    assert f"configuration 2 of 4 (nodes=0, params.seed=1) and 1 more with the same error:\n" \
           f"  sweep nodes=0 ({path}:6): nodes: must be at least 1" in text
    assert "configuration 0" not in text  # the valid ones are not listed


def test_the_limit_refuses_huge_sweeps_before_validating_them(spec_file):
    with pytest.raises(SpecError, match=r"the sweep has 1000000 configurations \(1000 \(params.a\) x 1000 "
                                        r"\(params.b\)\), more than sweep_limit \(2000\)"):
        load_job_or_sweep(spec_file("sweep_limit: 2000\n"), [], ["params.a=range(1000)", "params.b=range(1000)"])
    assert len(load_job_or_sweep(spec_file(), ["--set", "sweep_limit=4"][1:], ["params.a=range(4)"]).configurations) == 4
    with pytest.raises(SpecError, match="more than sweep_limit"):
        load_job_or_sweep(spec_file(), ["sweep_limit=3"], ["params.a=range(4)"])


def test_set_and_sweep_of_one_key_conflict(spec_file):
    with pytest.raises(SpecError, match=r"^--set params.lr=3: params.lr is also swept \(--sweep params.lr=1,2\)"):
        load_job_or_sweep(spec_file(), ["params.lr=3"], ["params.lr=1,2"])


def test_one_job_commands_refuse_a_sweep_spec(spec_file):
    path = spec_file("sweep:\n  params.lr: [1, 2]\n")
    with pytest.raises(SpecError, match=rf"^{path}:5: sweep: this spec is a sweep"):
        load_spec(path)
    assert load_spec(path, allow_sweep=True).params == {"lr": 0.1}
    result = CliRunner().invoke(main, ["render", str(path)])
    assert result.exit_code == 2 and "this spec is a sweep" in result.output and "Traceback" not in result.output


def test_cli_exit_code_2_and_no_folder_for_an_invalid_sweep(spec_file, tmp_path):
    result = CliRunner().invoke(main, ["run", str(spec_file()), "--sweep", "processes_per_node=1,0",
                                       "--run-dir", str(tmp_path / "out")])
    assert result.exit_code == 2 and "processes_per_node=0" in result.output
    assert not (tmp_path / "out").exists()


def test_dry_run_lists_the_configurations(spec_file, tmp_path):
    result = CliRunner().invoke(main, ["run", str(spec_file()), "--sweep", "params.lr=1,2", "--dry-run",
                                       "--run-dir", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[:3] == ["sweep of 2 configurations over params.lr:", "  0: params.lr=1",
                                              "  1: params.lr=2"]
    assert not (tmp_path / "out").exists()


def test_max_parallel_without_a_sweep_is_a_usage_error(spec_file):
    result = CliRunner().invoke(main, ["run", str(spec_file()), "--max-parallel", "2"])
    assert result.exit_code == 2 and "--max-parallel is for sweeps" in result.output


# --- job arrays: grouping, splitting, the script ---------------------------------------------

def test_arrays_group_by_resources_and_split_at_max_array_size(spec_file):
    sweep = load_job_or_sweep(spec_file(), [], ["nodes=1,2", "params.seed=range(5)"])
    folders = {c.index: task_folder(c.index, 10) for c in sweep.configurations}
    plans = plan_arrays(sweep, folders, limit=1001, workdir=Path("/w"))
    assert [p.indices for p in plans] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]  # one array per node count
    assert [p.spec.nodes for p in plans] == [1, 2]
    plans = plan_arrays(sweep, folders, limit=2, workdir=Path("/w"))
    assert [p.indices for p in plans] == [[0, 1], [2, 3], [4], [5, 6], [7, 8], [9]]
    assert plans[1].folders == ["task-002", "task-003"]
    same = load_job_or_sweep(spec_file(), [], ["params.lr=range(6)"])
    assert len(plan_arrays(same, {c.index: task_folder(c.index, 6) for c in same.configurations}, 1001,
                           Path("/w"))) == 1


def _array_script(spec_file, **kwargs):
    sweep = load_job_or_sweep(spec_file(), [], ["params.lr=0.1,0.2,0.3"])
    spec = sweep.configurations[0].spec.replace(entrypoint="/home/user/project/job.py:main")
    return render_array_script(spec, Path("/scratch/runs/my sweep"), ["task-000", "task-001", "task-002"],
                               Path("/home/user/project"), **kwargs)


def test_array_script_golden(spec_file):
    text = _array_script(spec_file, max_parallel=2).replace("jaxlaunch 0.1.0", "jaxlaunch VERSION")
    golden = GOLDEN / "array.sbatch"
    if os.environ.get("JAXLAUNCH_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text(), "regenerate: JAXLAUNCH_UPDATE_GOLDEN=1 python -m pytest tests/test_sweeps.py"


def test_array_task_i_runs_the_script_of_task_folder_i(spec_file, tmp_path):
    """Run the rendered array script with bash as Slurm would, for each SLURM_ARRAY_TASK_ID."""
    sweep_dir = tmp_path / "a sweep; $(touch PWNED)"
    folders = ["task-000", "task-001", "task-002"]
    for folder in folders:
        (sweep_dir / folder).mkdir(parents=True)
        (sweep_dir / folder / "job.sbatch").write_text(f'echo "ran {folder} in $PWD"\n')
    sweep = load_job_or_sweep(spec_file(), [], ["params.lr=0.1,0.2,0.3"])
    script = tmp_path / "array.sbatch"
    script.write_text(render_array_script(sweep.base, sweep_dir, folders, tmp_path, None))
    assert "#SBATCH --array=0-2\n" in script.read_text()
    for index, folder in enumerate(folders):
        done = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=tmp_path,
                              env={**os.environ, "SLURM_ARRAY_TASK_ID": str(index)})
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"ran {folder} in {tmp_path}\n"
    assert not (tmp_path / "PWNED").exists()


def test_scontrol_answers_for_an_array_task_by_its_own_id(monkeypatch):
    monkeypatch.setattr(scheduler, "call_slurm", lambda argv, **kw: (
        "JobId=14 ArrayJobId=12 ArrayTaskId=2 JobState=COMPLETED RunTime=00:00:08 NumNodes=1 ExitCode=0:0"))
    info = scheduler._from_scontrol("12_2")
    assert info is not None and info.state == "COMPLETED" and info.job_id == "12_2"
    assert scheduler._from_scontrol("12_3") is None


def test_squeue_answers_for_an_array_id_from_its_tasks(monkeypatch):
    monkeypatch.setattr(scheduler, "call_slurm", lambda argv, **kw: "12_0|COMPLETED|0:08|1\n12_1|RUNNING|0:03|1\n")
    info = scheduler._from_squeue("12")
    assert info.state == "RUNNING" and not info.finished and info.source == "squeue (array)"


# --- a local sweep, end to end ---------------------------------------------------------------

@pytest.mark.e2e
def test_local_sweep_two_at_a_time_one_injected_failure_keeps_the_other_five(tmp_path):
    sweep_dir = tmp_path / "sweep"
    result = jaxlaunch("run", JOBS / "sweep_train.yaml", "--max-parallel", "2", "--set", "params.steps=20",
                       "--set", "params.fail_when={seed: 1, learning_rate: 0.03}", "--run-dir", sweep_dir,
                       timeout=300)
    assert result.returncode == 1, result.stderr  # one configuration failed
    assert "sweep of 6 configurations" in result.stderr and ", 2 at a time" in result.stderr
    assert "sweep done: 5 COMPLETED, 1 FAILED (of 6)" in result.stderr
    assert "injected failure at step 5" in result.stderr  # the failing task's reason, shown
    record = json.loads((sweep_dir / "sweep.json").read_text())
    assert record["backend"] == "local" and record["keys"] == ["params.learning_rate", "params.seed"]
    from launcher import load_result
    for task in record["tasks"]:
        run = sweep_dir / task["folder"]
        state = json.loads((run / "status.json").read_text())["state"]
        values = task["values"]
        if values == {"params.learning_rate": 0.03, "params.seed": 1}:
            assert state == "FAILED" and not (run / "result.json").exists()
            assert "injected failure" in (run / "output.log").read_text()
        else:
            assert state == "COMPLETED"
            assert load_result(run)["config"] == {"learning_rate": values["params.learning_rate"],
                                                  "seed": values["params.seed"]}
    # the table on stdout: 6 rows, one FAILED
    rows = [line for line in result.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 6 and sum("FAILED" in row for row in rows) == 1
    results = jaxlaunch("results", sweep_dir, "--best", "final_loss", "--plot", "final_loss")
    assert results.returncode == 0, results.stderr
    assert "best final_loss (min)" in results.stdout and "params.learning_rate=0.1" in results.stdout.splitlines()[-1]
    assert (sweep_dir / "final_loss.png").stat().st_size > 10_000
    assert SweepDirectory(sweep_dir).read()["tasks"] == record["tasks"]
