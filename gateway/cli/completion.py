"""``a2a-gateway completion bash|zsh|fish``: shell completion made from the parser itself.

The scripts are generated from :func:`gateway.cli.main.build_parser` each time,
so every command, option and choice the CLI knows is completed, and none it
does not: no list to keep in step by hand. Commands nest (``pki issue``), an
option's value completes from its choices (``--log-format json``) or as a file
name (the options that take a path), and hidden options are left out.

bash: ``source <(a2a-gateway completion bash)``; zsh: the bash function under
``bashcompinit``; fish: ``a2a-gateway completion fish | source``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROG = "a2a-gateway"
SHELLS = ("bash", "zsh", "fish")


@dataclass(frozen=True, slots=True)
class Option:
    """One option of a command: its flags, whether it takes a value, and what value."""

    flags: tuple[str, ...]
    takes_value: bool
    choices: tuple[str, ...]
    path: bool
    help: str


@dataclass(slots=True)
class Command:
    """One command (``""`` the top, ``"pki:issue"`` a nested one) and what follows it."""

    key: str
    commands: dict[str, str] = field(default_factory=dict)
    """Subcommand name (aliases too) -> its help."""
    options: list[Option] = field(default_factory=list)
    positional_choices: tuple[str, ...] = ()


def add_commands(commands: Any) -> None:
    """Register ``completion``."""
    completion = commands.add_parser(
        "completion", help="print shell completion: source <(a2a-gateway completion bash)"
    )
    completion.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    completion.set_defaults(run=_completion)


def _completion(args: argparse.Namespace) -> int:
    from gateway.cli.main import build_parser

    print(script(args.shell, build_parser()), end="")
    return 0


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    """The completion script for ``shell`` (one of :data:`SHELLS`)."""
    tree = list(_commands(parser, ""))
    if shell == "fish":
        return _fish(tree)
    bash = _bash(tree)
    if shell == "zsh":
        return f"#compdef {PROG}\nautoload -U +X bashcompinit && bashcompinit\n{bash}"
    return bash


def _commands(parser: argparse.ArgumentParser, key: str) -> Iterator[Command]:
    node = Command(key)
    nested: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                node.commands[name] = helps.get(name, "")
                nested.append((name, sub))
        elif action.help == argparse.SUPPRESS:
            continue
        elif action.option_strings:
            node.options.append(_option(action))
        elif action.choices:
            node.positional_choices = tuple(str(c) for c in action.choices)
    yield node
    for name, sub in nested:
        yield from _commands(sub, f"{key}:{name}" if key else name)


def _option(action: argparse.Action) -> Option:
    takes_value = action.nargs != 0
    kind = getattr(action.type, "__name__", "")
    return Option(
        flags=tuple(action.option_strings),
        takes_value=takes_value,
        choices=tuple(str(c) for c in action.choices or ()),
        path=takes_value and (action.type is Path or kind.endswith("location")),
        help=(action.help or "").replace("%%", "%"),
    )


def _bash(tree: list[Command]) -> str:
    steps = [
        f'"{node.key}:{name}") node="{_join(node.key, name)}" ;;'
        for node in tree
        for name in node.commands
    ]
    words = [
        f'"{node.key}") commands="{" ".join(node.commands)}"; options="{_flags(node)}"; '
        f'positional="{" ".join(node.positional_choices)}" ;;'
        for node in tree
    ]
    values = [
        f'"{node.key}:{flag}") COMPREPLY=( $(compgen -W "{" ".join(option.choices)}" -- "$cur") ); '
        "return ;;"
        for node in tree
        for option in node.options
        if option.choices
        for flag in option.flags
    ]
    takes = [
        f'"{node.key}:{flag}") return ;;'
        for node in tree
        for option in node.options
        if option.takes_value and not option.choices
        for flag in option.flags
    ]
    lines = [
        f"# {PROG} completion for bash (made by `{PROG} completion bash`)",
        "_a2a_gateway() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="" node="" word i',
        '    (( COMP_CWORD > 0 )) && prev="${COMP_WORDS[COMP_CWORD-1]}"',
        "    for (( i = 1; i < COMP_CWORD; i++ )); do",
        '        word="${COMP_WORDS[i]}"',
        '        case "$node:$word" in',
        *(f"            {step}" for step in steps),
        "        esac",
        "    done",
        '    local commands="" options="" positional=""',
        '    case "$node" in',
        *(f"        {word}" for word in words),
        "    esac",
        "    COMPREPLY=()",
        '    case "$node:$prev" in',
        *(f"        {value}" for value in values),
        *(f"        {take}" for take in takes),  # a file name (readline's default) or text
        "    esac",
        '    if [[ "$cur" == -* ]]; then',
        '        COMPREPLY=( $(compgen -W "$options" -- "$cur") )',
        '    elif [[ -n "$commands" ]]; then',
        '        COMPREPLY=( $(compgen -W "$commands" -- "$cur") )',
        '    elif [[ -n "$positional" ]]; then',
        '        COMPREPLY=( $(compgen -W "$positional" -- "$cur") )',
        "    fi",
        "}",
        f"complete -o default -F _a2a_gateway {PROG}",
        "",
    ]
    return "\n".join(lines)


def _fish(tree: list[Command]) -> str:
    steps = " ".join(f"'{node.key}:{name}'" for node in tree for name in node.commands)
    lines = [
        f"# {PROG} completion for fish (made by `{PROG} completion fish`)",
        f"complete -c {PROG} -f",
        "function __a2a_gateway_node",
        "    set -l node ''",
        "    for word in (commandline -opc)[2..-1]",
        '        if contains -- "$node:$word" ' + steps,
        '            if test -z "$node"; set node $word; else; set node "$node:$word"; end',
        "        end",
        "    end",
        "    echo $node",
        "end",
    ]
    for node in tree:
        here = f"-n 'test (__a2a_gateway_node) = \"{node.key}\"'"
        for name, text in node.commands.items():
            lines.append(f"complete -c {PROG} {here} -a {_quote(name)} -d {_quote(text)}")
        for choice in node.positional_choices:
            lines.append(f"complete -c {PROG} {here} -a {_quote(choice)}")
        for option in node.options:
            lines.append(f"complete -c {PROG} {here} {_fish_option(option)}")
    return "\n".join([*lines, ""])


def _fish_option(option: Option) -> str:
    names = []
    for flag in option.flags:
        if flag.startswith("--"):
            names.append(f"-l {flag[2:]}")
        else:
            names.append(f"-s {flag[1:]}")
    if option.choices:
        names.append(f"-x -a {_quote(' '.join(option.choices))}")
    elif option.path:
        names.append("-r -F")
    elif option.takes_value:
        names.append("-x")
    if option.help:
        names.append(f"-d {_quote(option.help)}")
    return " ".join(names)


def _flags(node: Command) -> str:
    return " ".join(flag for option in node.options for flag in option.flags)


def _join(key: str, name: str) -> str:
    return f"{key}:{name}" if key else name


def _quote(text: str) -> str:
    """A fish single-quoted word."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
