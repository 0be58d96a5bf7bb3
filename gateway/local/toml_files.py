"""Reading TOML files an operator names (agent configs, policies) into validated models.

Both readers refuse what would hang or exhaust the process (a FIFO, a device, a
huge file) before parsing, and report every problem as ``file: key: why`` lines
with the keys written TOML-style.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from gateway.display import printable
from gateway.errors import ConfigError
from gateway.local.regular_files import NOT_REGULAR, read_regular_file
from gateway.local.toml_problems import toml_message, toml_path

M = TypeVar("M", bound=BaseModel)

MAX_FILE_BYTES = 16 * 1024 * 1024
"""Largest policy or agent config file read (about 100,000 grants); a larger one is refused."""


def describe_validation_error(
    source: str, err: ValidationError, data: Any = None, model: type[BaseModel] | None = None
) -> str:
    """One line per problem: ``file: key: why``, keys written TOML-style and the why in the
    file's words (``gateway.local.toml_problems``; ``model`` is what the file was read into)."""
    lines = []
    for problem in err.errors():
        path = toml_path(problem, model)
        key = _toml_key(path, data)
        why = toml_message(problem, model, path)
        # Keys, values and the path come from outside: a newline in one must
        # not forge a second problem line, nor ESC or bidi codes reach a terminal.
        lines.append(printable(f"{source}: {key or '(top level)'}: {why}"))
    return "\n".join(lines)


def _toml_key(loc: list[int | str], data: Any) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            peer = _peer_at(data, parts, item)
            parts[-1] = f"{parts[-1]}[{item}]" + (f" (peer {peer})" if peer else "")
        else:
            parts.append(str(item))
    return ".".join(parts)


def _peer_at(data: Any, parts: list[str], index: int) -> str | None:
    if len(parts) != 1 or not isinstance(data, dict):
        return None
    table = data.get(parts[0])
    if isinstance(table, list) and index < len(table) and isinstance(table[index], dict):
        peer = table[index].get("peer")
        return peer if isinstance(peer, str) else None
    return None


def parse_toml_model(
    model: type[M], text: str, source: str, error: type[ConfigError]
) -> tuple[M, dict[str, Any]]:
    """Parse TOML text into ``model``; raises ``error`` with file/key/why lines."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise error(printable(f"{source}: not valid TOML: {err}")) from err
    except RecursionError as err:  # tomllib recurses once per nesting level
        raise error(printable(f"{source}: not valid TOML: nested too deeply")) from err
    try:
        return model.model_validate(data), data
    except ValidationError as err:
        raise error(describe_validation_error(source, err, data, model)) from err
    except RecursionError as err:
        raise error(printable(f"{source}: nested too deeply to validate")) from err


def read_text(path: Path, what: str, error: type[ConfigError]) -> str:
    """Read a UTF-8 regular file of at most ``MAX_FILE_BYTES``; OS errors become ``error``.

    The file is opened without blocking and must be a regular file: a FIFO
    would block the reader (the agent's event loop, on a reload) forever, and
    a device such as ``/dev/zero``, or a huge file, would be read until memory
    ran out. Either is refused as ``error``, before anything is parsed.
    """
    try:
        data = read_regular_file(path, MAX_FILE_BYTES + 1)
    except FileNotFoundError as err:
        raise error(printable(f"{path}: {what} file not found")) from err
    except OSError as err:
        if err.strerror == NOT_REGULAR:
            raise error(printable(f"{path}: {what} file is not a regular file")) from err
        raise error(printable(f"{path}: {what} file unreadable: {err}")) from err
    if len(data) > MAX_FILE_BYTES:
        raise error(printable(f"{path}: {what} file is larger than {MAX_FILE_BYTES} bytes"))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise error(printable(f"{path}: {what} file unreadable: {err}")) from err
