"""Every flag says what it is for, and the shells complete what the parser knows.

The completion scripts are generated from the parser; bash's is run here with
the words a person would have typed, zsh's and fish's where those shells are
installed (they are skipped, saying so, where not).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest

from gateway.cli.main import build_parser, main


def _every_command(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("a2a-gateway",)
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.extend(_every_command(sub, (*path, name)))
    return found


def test_every_option_argument_and_command_has_help() -> None:
    missing = []
    for path, parser in _every_command(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helped = {choice.dest for choice in action._choices_actions if choice.help}
                aliases = {
                    name
                    for name, sub in action.choices.items()
                    if name not in helped and any(sub is action.choices[other] for other in helped)
                }
                missing += [(*path, n) for n in action.choices if n not in helped | aliases]
            elif not action.help:
                missing.append((*path, *(action.option_strings or [action.dest])))
    assert missing == []


def _script(shell: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Path:
    assert main(["completion", shell]) == 0
    path = tmp_path / f"a2a-gateway.{shell}"
    path.write_text(capsys.readouterr().out)
    return path


def _bash_complete(script: Path, *words: str) -> list[str]:
    """What bash offers after ``words`` (the last one is the word being completed)."""
    line = " ".join(f"'{word}'" for word in words)
    program = (
        f"source {script}\n"
        f"COMP_WORDS=(a2a-gateway {line}); COMP_CWORD={len(words)}\n"
        "_a2a_gateway\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", program],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return [line for line in done.stdout.splitlines() if line]


def test_bash_completes_commands_options_choices_and_nested_commands(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    script = _script("bash", capsys, tmp_path)
    top = [path[1] for path, _ in _every_command(build_parser()) if len(path) == 2]
    assert sorted(_bash_complete(script, "")) == sorted(top)
    assert _bash_complete(script, "pki", "i") == ["init", "issue"]
    assert {"--dir", "--uri-san-only", "--dns"} <= set(_bash_complete(script, "pki", "issue", "--"))
    assert _bash_complete(script, "--log-format", "") == ["json", "text"]
    assert _bash_complete(script, "-v", "completion", "") == ["bash", "zsh", "fish"]
    assert _bash_complete(script, "audit", "--db", "x.sqlite", "ver") == ["verify"]
    assert "--config" in _bash_complete(script, "config", "check", "--c")
    # A value that is a file name or free text: nothing from us (readline offers files).
    assert _bash_complete(script, "call", "--config", "") == []
    # Hidden options (the supervisor's) are never offered.
    assert not {"--worker", "--port"} & set(_bash_complete(script, "serve", "--"))


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_loads_the_script(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    script = _script("zsh", capsys, tmp_path)
    program = (
        f"autoload -U compinit && compinit -u -D; source {script}; "
        "print -r -- ${_comps[a2a-gateway]}"
    )
    done = subprocess.run(
        ["zsh", "-f", "-c", program], capture_output=True, text=True, timeout=30, check=True
    )
    assert done.stdout.strip() == "_bash_complete -o default -F _a2a_gateway", done.stderr


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_completes_nested_commands_and_choices(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    script = _script("fish", capsys, tmp_path)

    def complete(line: str) -> list[str]:
        done = subprocess.run(
            ["fish", "--no-config", "-c", f"source {script}; complete -C '{line}'"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return [entry.split("\t")[0] for entry in done.stdout.splitlines()]

    assert complete("a2a-gateway pki ") == ["init", "issue"]
    assert complete("a2a-gateway --log-format ") == ["json", "text"]
    assert "--uri-san-only" in complete("a2a-gateway pki issue --")
    assert complete("a2a-gateway completion ") == ["bash", "fish", "zsh"]
