"""The cross-rank preflight's comparison (launcher/rank/preflight.py) on reports written by hand: two
ranks bound to one GPU, a wrong device count, the odd rank marked in the table. Real ranks that differ
(an MPMD mpirun) are in tests/e2e/test_preflight.py."""

from launcher.rank.preflight import compare, format_reports, gpu_identities

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


H100 = "GPU-5e0859f0-c796-4dfe-800b-d851dd5dcb54"


def driver_files(tmp_path, gpus):
    """/proc/driver/nvidia/gpus as the driver writes it: one folder per GPU, by bus location."""
    for bus, uuid, model in gpus:
        folder = tmp_path / bus
        folder.mkdir()
        (folder / "information").write_text(f"Model: \t\t {model}\nIRQ:   \t\t 16\nGPU UUID: \t\t {uuid}\n"
                                             f"Bus Location: \t {bus}\nDevice Minor: \t 0\n")
    return str(tmp_path)


def test_one_gpu_under_two_names_is_caught(tmp_path):
    """Seen on an H100 (2026-11-26): rank 0 with CUDA_VISIBLE_DEVICES=0, rank 1 with the GPU's UUID
    ran both on the one GPU; the preflight compared the names as written."""
    info = driver_files(tmp_path, [("0000:0a:00.0", H100, "NVIDIA H100 80GB HBM3")])
    ids = [gpu_identities(["0"], info), gpu_identities([H100], info)]
    assert ids == [[H100], [H100]]
    problems = compare(reports({"gpus": ["0"], "gpu_ids": ids[0]}, {"gpus": [H100], "gpu_ids": ids[1]}),
                       expected_devices=1)
    assert problems == [f"GPU {H100} on node1 is bound to rank 0 and rank 1: two ranks would share one GPU "
                        "(check CUDA_VISIBLE_DEVICES and the binding)"]


def test_indices_follow_the_bus_order_unless_mixed_models_make_it_unsure(tmp_path):
    info = driver_files(tmp_path, [("0000:41:00.0", "GPU-b", "A100"), ("0000:0a:00.0", "GPU-a", "A100")])
    assert gpu_identities(["0", "1", "7"], info, order="") == ["GPU-a", "GPU-b", "7"]
    mixed = driver_files(tmp_path / "mixed", [("0000:41:00.0", "GPU-b", "A100"), ("0000:0a:00.0", "GPU-a", "V100")]) \
        if (tmp_path / "mixed").mkdir() is None else None
    assert gpu_identities(["0"], mixed, order="") == ["0"]  # CUDA orders fastest first: cannot tell
    assert gpu_identities(["0"], mixed, order="PCI_BUS_ID") == ["GPU-a"]
    assert gpu_identities(["0"], str(tmp_path / "none")) == ["0"]  # no driver files: as written


def test_wrong_device_count_and_odd_rank_marked():
    found = reports({}, {}, {"device_count": 2})
    problems = compare(found, expected_devices=1)
    assert problems[0] == "device_count: rank 2 has 2; the others have 1"
    assert "device_count: rank(s) 2 see a different number of devices" in problems[1]
    table = format_reports(found, problems)
    assert table.splitlines()[-1].split()[0] == "2" and "! 2" in table.splitlines()[-1]
