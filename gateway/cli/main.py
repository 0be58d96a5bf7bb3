"""``a2a-gateway``: argument parsing and the one place CLI errors become one-line messages."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import NoReturn

from pydantic import ValidationError

from gateway.cli import (
    admin_commands,
    agent_commands,
    check_commands,
    completion,
    db_commands,
    idempotency_commands,
    plan_commands,
    spiffe_commands,
)
from gateway.display import EscapingFormatter, printable
from gateway.errors import ConfigError, GatewayError, TaskNotFound
from gateway.postgres.dsn import redact_credentials
from gateway.telemetry.json_logs import JsonFormatter
from gateway.telemetry.sdk_logs import withhold_a2a_sdk_text

EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors escaped: they can quote an argument
    (``unrecognized arguments: ...``) that holds terminal control characters."""

    def error(self, message: str) -> NoReturn:
        """Print the usage and the escaped ``message``; exit 2."""
        super().error(printable(message))


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (every subcommand; each subparser is a ``_Parser`` too)."""
    parser = _Parser(
        prog="a2a-gateway", description="mTLS gRPC gateway for agents calling each other."
    )
    parser.add_argument("--version", action="version", version=f"a2a-gateway {_version()}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument(
        "--log-format",
        choices=["json", "text"],
        default=None,
        help="json: one object per line (default when stderr is not a terminal); text: escaped",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    agent_commands.add_commands(commands)
    admin_commands.add_commands(commands)
    plan_commands.add_commands(commands)
    idempotency_commands.add_commands(commands)
    db_commands.add_commands(commands)
    spiffe_commands.add_commands(commands)
    check_commands.add_commands(commands)
    completion.add_commands(commands)
    return parser


def _version() -> str:
    try:
        return metadata.version("a2a-peer-gateway")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown (not installed)"


def log_formatter(choice: str | None) -> logging.Formatter:
    """JSON lines unless asked for text or stderr is a terminal (a person reads it)."""
    if choice == "text" or (choice is None and sys.stderr.isatty()):
        return EscapingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    return JsonFormatter()


def _open_closed_standard_streams() -> None:
    """A standard stream the caller closed (``>&-``) becomes /dev/null: printing to it
    then loses the text instead of failing, and no file the command opens takes its
    descriptor (and with it, what is printed)."""
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        if getattr(sys, name) is None:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            setattr(sys, name, open(fd, "r" if fd == 0 else "w", closefd=False))


def _check_utf8(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """A usage error for an argument that is not UTF-8 (the OS passes such bytes through
    as surrogates, which no peer, database or file format takes). The value is not shown:
    it may be a DSN with a password."""
    for number, arg in enumerate(argv, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as err:
            parser.error(f"argument {number} is not valid UTF-8 (at character {err.start + 1})")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    _open_closed_standard_streams()
    parser = build_parser()
    arguments = sys.argv[1:] if argv is None else list(argv)
    _check_utf8(parser, arguments)
    args = parser.parse_args(arguments)
    handler = logging.StreamHandler()
    handler.setFormatter(log_formatter(args.log_format))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, handlers=[handler])
    withhold_a2a_sdk_text()  # every command, not only serve: the SDK's text may quote values
    try:
        result = args.run(args)
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        return int(result or 0)
    except (ConfigError, TaskNotFound) as err:
        # The operator's input (a file, a setting, a task id) is wrong. A file's
        # problem list (each line escaped where it was built) keeps
        # one problem per line, continuation lines indented; any other message
        # (a path, a peer's text) is escaped into a single line.
        local_problems = isinstance(err.__cause__, ValidationError)
        lines = err.message.split("\n") if local_problems else [err.message]
        first, *more = (printable(redact_credentials(line)) for line in lines)
        print("\n  ".join([f"error: {first}", *more]), file=sys.stderr)
        return EXIT_USAGE
    except GatewayError as err:
        # The message may come from a remote peer: escaped into one line. Only
        # an answer is a refusal; a peer that was never reached did not refuse.
        said = "failed" if err.unanswered else "refused"
        message = printable(redact_credentials(err.message))
        print(f"{said}: {printable(err.reason)}: {message}", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went (`| head`): not an error; and keep the exit-time flush quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as err:  # the CLI boundary: never a traceback for the user
        if os.environ.get("A2A_GATEWAY_DEBUG"):
            raise
        why = printable(redact_credentials(str(err)))
        print(f"internal error: {type(err).__name__}: {why}", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
