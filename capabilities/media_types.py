"""Media types (``type/subtype``) and the patterns contracts accept them by.

A media type is compared without its parameters and case-insensitively
(``Text/Plain; charset=utf-8`` is ``text/plain``). A pattern is a media type,
``type/*`` or ``*/*``.
"""

from __future__ import annotations

import re

_TOKEN = r"[A-Za-z0-9!#$&^_.+-]{1,64}"
_MEDIA_TYPE = re.compile(rf"{_TOKEN}/{_TOKEN}")
_PATTERN = re.compile(rf"(\*/\*|{_TOKEN}/\*|{_TOKEN}/{_TOKEN})")
MAX_MEDIA_TYPE_CHARS = 255
OCTET_STREAM = "application/octet-stream"
"""What a file part without a media type is taken to be."""


def essence(media_type: str) -> str | None:
    """``media_type`` without parameters, lowercased; None if it is not one."""
    if len(media_type) > MAX_MEDIA_TYPE_CHARS:
        return None
    bare = media_type.partition(";")[0].strip()
    return bare.lower() if _MEDIA_TYPE.fullmatch(bare) else None


def check_media_type(media_type: str, what: str) -> None:
    """Raise ValueError unless ``media_type`` is a media type (parameters allowed)."""
    if not isinstance(media_type, str) or essence(media_type) is None:
        raise ValueError(f"{what} must be a media type such as 'text/plain'")


def check_pattern(pattern: str, what: str) -> str:
    """``pattern`` lowercased; ValueError unless it is ``type/subtype``, ``type/*`` or ``*/*``."""
    if not isinstance(pattern, str) or not _PATTERN.fullmatch(pattern):
        raise ValueError(f"{what}: {pattern!r} is not 'type/subtype', 'type/*' or '*/*'")
    return pattern.lower()


def matches(patterns: tuple[str, ...], media_type: str) -> bool:
    """True if the media type ``media_type`` fits one of the lowercased ``patterns``."""
    bare = essence(media_type)
    if bare is None:
        return False
    kind = bare.partition("/")[0]
    return any(p in ("*/*", bare) or p == f"{kind}/*" for p in patterns)
