"""`make mutate` (tests/mutate.py) mutates the modules named and runs the unit tests that reach
them: those that import one, or whose imports lead to one through launcher/'s top-level imports."""

from mutate import covering_tests, imported, module_file, reached


def write(root, name, text):
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_test_is_chosen_when_it_imports_the_module_or_reaches_it_through_imports(tmp_path):
    write(tmp_path, "launcher/__init__.py", "")
    write(tmp_path, "launcher/supervisor/__init__.py", "from .supervise import supervise\n")
    write(tmp_path, "launcher/supervisor/supervise.py", "from . import governor\n")
    write(tmp_path, "launcher/supervisor/governor.py", "")
    write(tmp_path, "launcher/cli.py", "def main():\n    from .supervisor import governor\n")  # late: not followed
    write(tmp_path, "tests/unit/test_governor.py", "from launcher.supervisor import governor\n")
    write(tmp_path, "tests/unit/test_supervise.py", "def test():\n    from launcher.supervisor.supervise import x\n")
    write(tmp_path, "tests/unit/test_patches.py", "def test(m):\n    m.setattr('launcher.supervisor.governor.x', 1)\n")
    write(tmp_path, "tests/unit/test_cli.py", "from launcher.cli import main\n")
    write(tmp_path, "tests/unit/test_layout.py", "from launcher.supervisor import governor\n")  # never run
    names = lambda tests: [t.name for t in tests]  # noqa: E731
    assert names(covering_tests(["launcher.supervisor.governor"], "direct", tmp_path)) == [
        "test_governor.py", "test_patches.py"]
    assert names(covering_tests(["launcher.supervisor.governor"], "imports", tmp_path)) == [
        "test_governor.py", "test_patches.py", "test_supervise.py"]
    assert "launcher.supervisor.governor" in reached({"launcher.supervisor"}, tmp_path)
    assert imported(tmp_path / "launcher/supervisor/supervise.py", tmp_path) == {
        "launcher.supervisor", "launcher.supervisor.governor"}
    assert module_file("launcher.supervisor", tmp_path).name == "__init__.py"
