"""The cross-rank preflight's comparison (launcher/rank/preflight.py) on reports written by hand: two
ranks bound to one GPU, a wrong device count, the odd rank marked in the table. Real ranks that differ
(an MPMD mpirun) are in tests/e2e/test_preflight.py."""

from launcher.rank.preflight import compare, format_reports

BASE = {"host": "node1", "python": "/venv/bin/python", "python_version": "3.11.7", "jax": "0.10.2",
        "jaxlib": "0.10.2", "mpi4jax": "0.9.1", "mpi4py": "4.1.2", "numpy": "2.4.6",
        "mpi_library": "Open MPI v5.0.11", "platform": "gpu", "device_count": 1, "gpus": []}


def reports(*overrides):
    return [{**BASE, "rank": rank, **extra} for rank, extra in enumerate(overrides)]


def test_two_ranks_bound_to_one_gpu():
    problems = compare(reports({"gpus": ["0"]}, {"gpus": ["0"]}), expected_devices=1)
    assert problems == ["GPU 0 on node1 is bound to rank 0 and rank 1: two ranks would share one GPU "
                        "(check CUDA_VISIBLE_DEVICES and the binding)"]
    assert compare(reports({"gpus": ["0"]}, {"gpus": ["1"]}), expected_devices=1) == []
    assert compare(reports({"gpus": ["0"]}, {"gpus": ["0"], "host": "node2"}), expected_devices=1) == []


def test_wrong_device_count_and_odd_rank_marked():
    found = reports({}, {}, {"device_count": 2})
    problems = compare(found, expected_devices=1)
    assert problems[0] == "device_count: rank 2 has 2; the others have 1"
    assert "device_count: rank(s) 2 see a different number of devices" in problems[1]
    table = format_reports(found, problems)
    assert table.splitlines()[-1].split()[0] == "2" and "! 2" in table.splitlines()[-1]
