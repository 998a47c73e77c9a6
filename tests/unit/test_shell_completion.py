"""Shell completion, which Click generates for the `jaxlaunch` console script (bash, zsh, fish)."""

import os

from conftest import jaxlaunch


def test_shell_completion_scripts_are_generated():
    for shell, marker in (("bash", "complete -o nosort -F"), ("zsh", "#compdef jaxlaunch"), ("fish", "complete --no-files --command jaxlaunch")):
        result = jaxlaunch(env={**os.environ, "_JAXLAUNCH_COMPLETE": f"{shell}_source"})
        assert result.returncode == 0 and marker in result.stdout, (shell, result.stdout[:200])
    words = jaxlaunch(env={**os.environ, "_JAXLAUNCH_COMPLETE": "bash_complete", "COMP_WORDS": "jaxlaunch su",
                           "COMP_CWORD": "1"})
    assert "plain,submit" in words.stdout.split()
