"""Unit tests of the job's persistent compilation cache (launcher/rank/compile_cache.py): where it
is, what its key holds, its permissions, and the spec key. The restart that reuses it runs in
tests/e2e/test_hangs.py."""

import os
import stat

import pytest

from launcher.rank import compile_cache


def test_the_key_names_jaxlib_the_platform_and_the_machine_kind(monkeypatch):
    from importlib import metadata

    key = compile_cache.cache_key("cpu")
    assert key.startswith(f"jaxlib-{metadata.version('jaxlib')}-cpu-")
    monkeypatch.setattr(compile_cache, "machine_kind", lambda platform: "x86_64\nsome cpu\navx512f sse4_2")
    with_avx512 = compile_cache.cache_key("cpu")
    monkeypatch.setattr(compile_cache, "machine_kind", lambda platform: "x86_64\nsome cpu\nsse4_2")
    assert compile_cache.cache_key("cpu") != with_avx512  # a login node's executables are not a compute node's


def test_the_machine_kind_reads_the_cpu_model_and_flags():
    kind = compile_cache.machine_kind("cpu")
    if os.path.exists("/proc/cpuinfo"):
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith(("flags", "Features")))
        assert flags.partition(":")[2].strip() in kind


def test_the_folder_is_the_run_directorys_a_chosen_one_or_none(tmp_path):
    key = compile_cache.cache_key("cpu")
    assert compile_cache.cache_folder("run_dir", tmp_path, "cpu") == tmp_path / "compile-cache" / key
    assert compile_cache.cache_folder("/scratch/cache", tmp_path, "cpu") == compile_cache.Path("/scratch/cache") / key
    assert compile_cache.cache_folder(None, tmp_path, "cpu") is None


def test_the_environment_makes_the_folder_private_and_keeps_the_users_settings(tmp_path):
    folder = tmp_path / "run" / "compile-cache" / "k"
    env = compile_cache.environment(folder, {}, private_parent=True)
    assert env == {"JAX_COMPILATION_CACHE_DIR": str(folder), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    for path in (folder, folder.parent):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700  # cached executables are code this user runs
    assert compile_cache.environment(folder, {"JAX_COMPILATION_CACHE_DIR": "/mine"}) == {}
    assert compile_cache.environment(folder, {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "2"}) == {
        "JAX_COMPILATION_CACHE_DIR": str(folder)}
    assert compile_cache.environment(None, {}) == {}


def test_an_existing_cache_folder_is_made_private_too(tmp_path):
    """mkdir's mode holds only for a new folder: one left 0755 by an earlier run is chmodded."""
    folder = tmp_path / "cache" / "k"
    folder.mkdir(parents=True, mode=0o755)
    os.chmod(folder, 0o755)
    compile_cache.environment(folder, {})
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_cache_folder_that_is_a_symbolic_link_is_refused_even_to_a_folder_of_ours(tmp_path):
    """Whoever can replace the link can point the cache at executables of theirs (issue 55)."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "cache"
    link.symlink_to(real, target_is_directory=True)
    with pytest.raises(compile_cache.UnsafeCacheError, match="is not a folder .a symbolic link or a file."):
        compile_cache.environment(link, {})
    with pytest.raises(compile_cache.UnsafeCacheError, match="is not a folder"):
        compile_cache.environment(link / "k", {}, private_parent=True)  # the run directory's compile-cache/
    assert compile_cache.environment(real, {})["JAX_COMPILATION_CACHE_DIR"] == str(real)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder another user owns")
def test_a_cache_folder_another_user_owns_or_anyone_can_write_is_refused(tmp_path):
    """Issue 44, item 14 (reproduced): a chosen compile_cache folder owned by uid 65534, mode 0777,
    was used (JAX_COMPILATION_CACHE_DIR pointed there); make_private_dir refuses the same folder."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, 65534, 65534)
    os.chmod(shared, 0o777)
    with pytest.raises(compile_cache.UnsafeCacheError, match="can be written by other users"):
        compile_cache.environment(shared / "k", {})
    theirs = tmp_path / "mine" / "k"
    theirs.mkdir(parents=True)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(compile_cache.UnsafeCacheError, match="belongs to another user"):
        compile_cache.environment(theirs, {})
    os.chmod(shared, 0o1777)  # sticky, as /tmp: nobody else can rename our folder in it
    assert compile_cache.environment(shared / "k", {})["JAX_COMPILATION_CACHE_DIR"] == str(shared / "k")


def test_the_gpu_models_are_part_of_the_key(monkeypatch, tmp_path):
    """Executables compiled for one GPU model do not load on another (issue 44's planted bug: the
    models left out of the key)."""
    models = tmp_path / "gpus"
    (models / "0000:01:00.0").mkdir(parents=True)
    info = models / "0000:01:00.0" / "information"
    real = compile_cache.Path
    monkeypatch.setattr(compile_cache, "Path", lambda p: models if p == "/proc/driver/nvidia/gpus" else real(p))
    info.write_text("Model: \t NVIDIA H100 80GB HBM3\n")
    h100 = compile_cache.machine_kind("gpu")
    info.write_text("Model: \t NVIDIA A100-SXM4-40GB\n")
    assert "H100" in h100 and compile_cache.machine_kind("gpu") != h100
    assert "A100" not in compile_cache.machine_kind("cpu")


def test_the_counter_counts_jaxs_cache_events():
    counter = compile_cache.CacheCounter()
    counter._on_event("/jax/compilation_cache/cache_hits")
    counter._on_event("/jax/compilation_cache/cache_misses")
    counter._on_event("/jax/compilation_cache/cache_misses")
    counter._on_event("/jax/something_else")
    assert counter.counts == {"hits": 1, "misses": 2}


def test_the_spec_key_defaults_to_the_run_directory_and_refuses_a_relative_folder(write_spec):
    from launcher.spec.load import load_spec
    from launcher.errors import SpecError

    assert load_spec(write_spec("name: x\nentrypoint: m:f\n")).compile_cache == "run_dir"
    assert load_spec(write_spec("name: x\nentrypoint: m:f\ncompile_cache: null\n")).compile_cache is None
    assert load_spec(write_spec("name: x\nentrypoint: m:f\ncompile_cache: /scratch/c\n")).compile_cache == "/scratch/c"
    with pytest.raises(SpecError, match="compile_cache.*absolute"):
        load_spec(write_spec("name: x\nentrypoint: m:f\ncompile_cache: cache\n"))
