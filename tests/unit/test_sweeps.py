"""Sweeps without Slurm: declaring and expanding them, validation of every configuration, the job
array scripts (golden file, and what bash really runs). A local sweep end to end under mpirun is
tests/e2e/test_local_sweep.py; the Slurm arrays themselves are in tests/slurm/test_slurm_sweep.py."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import GOLDEN
from fake_slurm import refused
from launcher.cli import main
from launcher.errors import SpecError
from launcher.backends.slurm import scheduler
from launcher.backends.slurm.render import render_array_script
from launcher.spec import JobSpec, load_spec
from launcher.backends.slurm.array import plan_arrays
from launcher.sweeps.directory import SweepDirectory, task_folder
from launcher.sweeps.plan import expand_range, load_job_or_sweep

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
    assert text == golden.read_text(), "regenerate: JAXLAUNCH_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_sweeps.py"


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


def test_scontrol_answers_for_an_array_task_by_its_own_id(fake_slurm):
    fake_slurm.answers["scontrol show job"] = (
        "JobId=14 ArrayJobId=12 ArrayTaskId=2 JobState=COMPLETED RunTime=00:00:08 NumNodes=1 ExitCode=0:0")
    info = scheduler._scontrol_infos(["12_2"])["12_2"]
    assert info.state == "COMPLETED" and info.job_id == "12_2"
    assert scheduler._scontrol_infos(["12_3"]) == {}


def test_squeue_answers_for_an_array_id_from_its_tasks(fake_slurm):
    fake_slurm.queue.update({"12_0": "COMPLETED|0:08|1", "12_1": "RUNNING|0:03|1"})
    info = scheduler._squeue_infos(["12"])["12"]
    assert info.state == "RUNNING" and not info.finished and info.source == "squeue (array)"


# --- --set of a swept key's parent ----------------------------------------------------------


def test_set_of_the_parent_dict_keeps_each_configurations_swept_value(spec_file):
    sweep = load_job_or_sweep(spec_file(), ["params={lr: 0.5, depth: 3}"], ["params.seed=1,2,3"])
    assert labels(sweep) == [{"params.seed": s} for s in (1, 2, 3)]
    assert [c.spec.params for c in sweep.configurations] == [{"lr": 0.5, "depth": 3, "seed": s} for s in (1, 2, 3)]
    assert sweep.base.params == {"lr": 0.5, "depth": 3}  # the --set, without any swept value
    # the same from the spec's sweep: section, and with the swept key also in the --set dict's siblings
    sweep = load_job_or_sweep(spec_file("sweep:\n  params.seed: [7, 8]\n"), ["params={lr: 0.2}"])
    assert [c.spec.params for c in sweep.configurations] == [{"lr": 0.2, "seed": 7}, {"lr": 0.2, "seed": 8}]


def test_sweep_inside_a_nested_set_dict_keeps_each_configurations_value(spec_file):
    sweep = load_job_or_sweep(spec_file(), ["params.opt={lr: 0.1, b: 2}"], ["params.opt.lr=1,2"])
    assert [c.spec.params["opt"] for c in sweep.configurations] == [{"lr": 1, "b": 2}, {"lr": 2, "b": 2}]
    assert sweep.base.params["opt"] == {"lr": 0.1, "b": 2}


# --- declaring values: more edges -----------------------------------------------------------


@pytest.mark.parametrize("text, values", [
    ("range(0, 5, 2)", [0, 2, 4]), ("range(0, 6, 2)", [0, 2, 4]), ("range(1)", [0]), ("range(-2, 2)", [-2, -1, 0, 1]),
    ("range(2, -1, -1)", [2, 1, 0]), ("range(0, 3, 1.0)", [0.0, 1.0, 2.0]), ("range(0, 1, 0.25)", [0.0, 0.25, 0.5, 0.75]),
    ("range(1.0)", [0.0]), (" range( 1 , 4 ) ", [1, 2, 3]), ("range(10, 13)", [10, 11, 12]),
    ("range(0, 7, 3)", [0, 3, 6]), ("range(0, 1, 0.3)", [0.0, 0.3, 0.6, 0.9]), ("range(0, 1, 0.4)", [0.0, 0.4, 0.8]),
])
def test_range_endpoints_and_types(text, values):
    got = expand_range(text, "here", 1000)
    assert got == values and [type(v) for v in got] == [type(v) for v in values]


def test_range_may_have_exactly_sweep_limit_values():
    assert expand_range("range(5)", "here", 5) == [0, 1, 2, 3, 4]
    with pytest.raises(SpecError, match=r"^here: range\(6\) has 6 values, more than sweep_limit \(5\)"):
        expand_range("range(6)", "here", 5)
    with pytest.raises(SpecError, match="is empty"):
        expand_range("range(0, 5, -1)", "here", 5)


def test_values_with_braces_brackets_and_quotes_stay_whole(spec_file):
    sweep = load_job_or_sweep(spec_file(), [], ['params.x={a: 1, b: 2},{a: 3},[1, {c: 4}],"p,q",(x,y)'])
    assert [c.values["params.x"] for c in sweep.configurations] == [{"a": 1, "b": 2}, {"a": 3}, [1, {"c": 4}],
                                                                    "p,q", "(x,y)"]


def test_equal_values_of_different_types_are_not_duplicates(spec_file):
    sweep = load_job_or_sweep(spec_file(), [], ["params.x=1,1.0,true,'1'"])
    values = [c.values["params.x"] for c in sweep.configurations]
    assert values == [1, 1.0, True, "1"] and [type(v) for v in values] == [int, float, bool, str]
    with pytest.raises(SpecError, match="1.0 is listed twice"):
        load_job_or_sweep(spec_file(), [], ["params.x=1.0,2,1.0"])


@pytest.mark.parametrize("key", ["max_parallel", "sweep_limit", "run_dir", "sweep", "sweep.params.lr"])
def test_keys_that_shape_the_sweep_cannot_be_swept(spec_file, key):
    with pytest.raises(SpecError, match=rf"^--sweep {key}=1,2: {key} cannot be swept"):
        load_job_or_sweep(spec_file(), [], [f"{key}=1,2"])


def test_a_new_flag_key_comes_after_the_sections_keys(spec_file):
    sweep = load_job_or_sweep(spec_file("sweep:\n  params.b: [1, 2]\n"), [], ["params.a=3,4"])
    assert sweep.keys == ["params.b", "params.a"]
    assert labels(sweep) == [{"params.b": b, "params.a": a} for b in (1, 2) for a in (3, 4)]
    assert sweep.configurations[1].label() == "params.b=1, params.a=4"


def test_only_the_first_errors_are_shown_and_the_rest_counted(spec_file):
    # 8 distinct errors (one per bad name); the message lists 5 and counts the other 3
    names = ",".join(f"'bad {i}'" for i in range(8))
    with pytest.raises(SpecError) as error:
        load_job_or_sweep(spec_file(), [], [f"name=ok,{names}"])
    text = str(error.value)
    assert [f"configuration {i} of 9" in text for i in range(1, 9)] == [True] * 5 + [False] * 3
    assert text.endswith("\n(and 3 more errors)")
    with pytest.raises(SpecError) as error:
        load_job_or_sweep(spec_file(), [], [f"name={','.join(names.split(',')[:5])}"])
    assert "more errors" not in str(error.value) and "configuration 4 of 5 ('bad 4')" not in str(error.value)
    assert "configuration 4 of 5 (name='bad 4')" in str(error.value)


# --- job arrays on a stub Slurm: the ids, logs and index each task is recorded with ------------


@pytest.fixture
def stub_slurm(monkeypatch, tmp_path, fake_slurm):
    """install(): the shared fake Slurm as these tests want it: `scontrol show config` says `config`,
    sbatch answers `ids` in turn and refuses its `fail`-th call, squeue lists nothing."""
    monkeypatch.setenv("JAXLAUNCH_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)

    def install(config="MaxArraySize            = 3\n", ids=("101", "102"), fail=None):
        fake_slurm.answers["scontrol show config"] = config
        fake_slurm.ids = list(ids)
        if fail is not None:
            fake_slurm.ids.insert(fail - 1, refused("sbatch: error: QOSMaxSubmitJobPerUserLimit", ["sbatch"]))
        return fake_slurm
    return install


def _submitted_sweep(spec_file, tmp_path, max_parallel=2, flags=("params.seed=range(5)",), **slurm):
    from launcher.backends.slurm.array import submit_sweep

    sweep = load_job_or_sweep(spec_file(), [], list(flags))
    directory = SweepDirectory.create(sweep, tmp_path / "sw", backend="slurm")
    echoed = []
    ids = submit_sweep(sweep, directory, max_parallel, echo=echoed.append)
    return directory, ids, echoed


def test_a_split_sweeps_tasks_have_their_own_arrays_index_from_0(spec_file, tmp_path, stub_slurm):
    from launcher.backends.slurm.index import sweep_dir_of

    fake = stub_slurm()
    directory, ids, echoed = _submitted_sweep(spec_file, tmp_path)
    sw = directory.path
    assert ids == ["101", "102"]
    assert [c for c in fake.calls if c[0] == "sbatch"] == [["sbatch", "--parsable", str(sw / "array-0.sbatch")],
                                                           ["sbatch", "--parsable", str(sw / "array-1.sbatch")]]
    assert echoed == ["array 101: 3 tasks (task-000 .. task-002)", "array 102: 2 tasks (task-003 .. task-004)"]
    record = json.loads((sw / "sweep.json").read_text())
    assert record["arrays"] == [{"job_id": "101", "script": str(sw / "array-0.sbatch"), "tasks": [0, 1, 2]},
                                {"job_id": "102", "script": str(sw / "array-1.sbatch"), "tasks": [3, 4]}]
    expected = ["101_0", "101_1", "101_2", "102_0", "102_1"]
    assert [t["job_id"] for t in record["tasks"]] == expected
    assert [t["index"] for t in record["tasks"]] == [0, 1, 2, 3, 4]
    for index, job_id in enumerate(expected):
        run = sw / f"task-00{index}"
        status = json.loads((run / "status.json").read_text())
        assert (status["state"], status["backend"], status["job_id"]) == ("SUBMITTED", "slurm", job_id)
        assert status["log"] == str(sw / "logs" / f"slurm-{job_id}.out")  # Slurm's %A_%a: this array's index
        assert status["script"] == str(run / "job.sbatch") and (run / "job.sbatch").exists()
    # jaxlaunch's job index ($JAXLAUNCH_HOME/jobs): each task id names its run directory, each array its sweep
    index = tmp_path / "home" / "jobs"
    assert sorted(p.name for p in index.iterdir()) == sorted(f"{i}.json" for i in ["101", "102", *expected])
    for index_number, job_id in enumerate(expected):
        assert json.loads((index / f"{job_id}.json").read_text()) == {
            "job_id": job_id, "run_dir": str(sw / f"task-00{index_number}")}
    assert json.loads((index / "102.json").read_text()) == {"job_id": "102", "sweep_dir": str(sw)}
    assert sweep_dir_of("102").path == sw and sweep_dir_of("102_0") is None
    # each array runs its own folders, indexed from 0, throttled by %M
    first, second = (sw / "array-0.sbatch").read_text(), (sw / "array-1.sbatch").read_text()
    assert "#SBATCH --array=0-2%2\n" in first and "TASKS=(task-000 task-001 task-002)\n" in first
    assert "#SBATCH --array=0-1%2\n" in second and "TASKS=(task-003 task-004)\n" in second
    assert "(sweep tasks from index 0)" in first and "(sweep tasks from index 3)" in second


def test_array_task_i_of_a_later_array_runs_its_own_folder_i(spec_file, tmp_path, stub_slurm):
    stub_slurm()
    directory, _, _ = _submitted_sweep(spec_file, tmp_path)
    for index in range(5):
        (directory.path / f"task-00{index}" / "job.sbatch").write_text(f"echo ran task {index}\n")
    for script, position, index in (("array-0.sbatch", 2, 2), ("array-1.sbatch", 0, 3), ("array-1.sbatch", 1, 4)):
        done = subprocess.run(["bash", str(directory.path / script)], capture_output=True, text=True, cwd=tmp_path,
                              env={**os.environ, "SLURM_ARRAY_TASK_ID": str(position)})
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"ran task {index}\n"


def test_no_throttle_and_the_default_max_array_size(spec_file, tmp_path, stub_slurm):
    fake = stub_slurm(config="ClusterName = c\n", ids=("7",))
    directory, ids, _ = _submitted_sweep(spec_file, tmp_path, max_parallel=None)
    assert ids == ["7"] and [c for c in fake.calls if c[0] == "scontrol"] == [["scontrol", "show", "config"]]
    assert "#SBATCH --array=0-4\n" in (directory.path / "array-0.sbatch").read_text()
    assert [t["job_id"] for t in directory.read()["tasks"]] == [f"7_{i}" for i in range(5)]


@pytest.mark.parametrize("config, size", [
    ("MaxArraySize            = 5\nMaxJobCount = 10000\n", 5), ("MaxArraySize=40001\n", 40001),
    ("AccountingStorageType = x\nMaxArraySize = 1\n", 1), ("MaxJobCount = 7\n", 1001), ("", 1001),
])
def test_max_array_size_from_scontrol(fake_slurm, config, size):
    from launcher.backends.slurm.array import max_array_size

    fake_slurm.answers["scontrol show config"] = config
    assert max_array_size() == size


def test_max_array_size_is_the_length_of_each_array(spec_file, tmp_path, stub_slurm):
    """MaxArraySize N: indices 0..N-1, so N tasks per array, no more and no fewer."""
    stub_slurm(config="MaxArraySize = 5\n", ids=("1", "2", "3"))
    directory, ids, _ = _submitted_sweep(spec_file, tmp_path, flags=("params.seed=range(11)",))
    assert ids == ["1", "2", "3"]
    assert [a["tasks"] for a in directory.read()["arrays"]] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10]]
    assert "#SBATCH --array=0-4%2\n" in (directory.path / "array-1.sbatch").read_text()
    assert "#SBATCH --array=0-0%2\n" in (directory.path / "array-2.sbatch").read_text()
    assert directory.read()["tasks"][10]["job_id"] == "3_0" and directory.read()["tasks"][5]["job_id"] == "2_0"


def test_a_refused_array_marks_only_its_tasks_and_keeps_the_submitted_ones(spec_file, tmp_path, stub_slurm):
    stub_slurm(fail=2)
    with pytest.raises(scheduler.SchedulerError, match="QOSMaxSubmitJobPerUserLimit"):
        _submitted_sweep(spec_file, tmp_path)
    sw = tmp_path / "sw"
    record = json.loads((sw / "sweep.json").read_text())
    assert record["arrays"] == [{"job_id": "101", "script": str(sw / "array-0.sbatch"), "tasks": [0, 1, 2]}]
    states = [json.loads((sw / f"task-00{i}" / "status.json").read_text()) for i in range(5)]
    assert [s["state"] for s in states] == ["SUBMITTED"] * 3 + ["SUBMIT_FAILED"] * 2
    assert "QOSMaxSubmitJobPerUserLimit" in states[3]["error"] and "job_id" not in states[3]


def test_task_states_from_squeue_then_each_tasks_own_status(spec_file, tmp_path, stub_slurm):
    from launcher.rundir import RunDirectory
    from launcher.backends.slurm.array_status import all_finished, count_states, summary_line, task_states

    fake = stub_slurm()
    directory, _, _ = _submitted_sweep(spec_file, tmp_path)
    RunDirectory(directory.path / "task-002").update_status(state="TIMEOUT", started=1000.0, ended=1000.0 + 2 * 3600 + 3 * 60 + 4)
    RunDirectory(directory.path / "task-001").update_status(state="COMPLETED")
    fake.answers["squeue"] = ("101_0|RUNNING|0:05\n101_1|FAILED|0:10\n102_0|PENDING|0:00\n102_1|CANCELLED by 0|0:01\n"
                   "garbage line\n")
    states = task_states(directory)
    assert fake.calls[-1] == ["squeue", "-r", "--noheader", "--states=all", "--jobs", "101,102", "--format=%i|%T|%M"]
    assert [(t.index, t.folder, t.job_id, t.state, t.elapsed) for t in states] == [
        (0, "task-000", "101_0", "RUNNING", "0:05"),
        (1, "task-001", "101_1", "COMPLETED", "0:10"),   # Slurm says it ended; the supervisor knows better
        (2, "task-002", "101_2", "TIMEOUT", "2:03:04"),  # purged from squeue: its own status.json
        (3, "task-003", "102_0", "PENDING", "0:00"),
        (4, "task-004", "102_1", "CANCELLED", "0:01")]
    assert [t.values for t in states] == [{"params.seed": i} for i in range(5)]
    assert count_states(states) == {"RUNNING": 1, "COMPLETED": 1, "TIMEOUT": 1, "PENDING": 1, "CANCELLED": 1}
    assert summary_line(directory, states) == (f"sweep {directory.path} (5 tasks; arrays 101, 102): 1 CANCELLED, "
                                               f"1 COMPLETED, 1 PENDING, 1 RUNNING, 1 TIMEOUT")
    assert not all_finished(states)
    fake.answers["squeue"] = "101_0|COMPLETED|0:09\n102_0|FAILED|0:01\n101_1|COMPLETED|0:10\n102_1|CANCELLED|0:01\n"
    assert all_finished(task_states(directory))
