"""How sure a step's result is: quorum comparison and deterministic checks.

A step that asks for ``verify: {"quorum": N}`` runs on N distinct sources; their
outputs are compared by the SHA-256 of their canonical JSON (or of the listed
``compare`` paths only). The result's confidence:

* ``verified``: all N answered and agree, or a deterministic check
  (``expect.equals`` / ``expect.range``) passed;
* ``partial``: the sources that answered agree, but fewer than N answered;
* ``unverified``: no verification asked, or the sources disagree. Disagreement
  is never resolved silently: every distinct output is kept as a candidate.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gateway.errors import ExpectationFailed
from gateway.plans.document.json_paths import read_path
from gateway.plans.document.model import Expect, Verify


class Confidence(StrEnum):
    """How sure a result is, weakest last."""

    VERIFIED = "verified"
    PARTIAL = "partial"
    UNVERIFIED = "unverified"

    @property
    def strength(self) -> int:
        """2 for verified, 1 for partial, 0 for unverified."""
        return _STRENGTH[self]


_STRENGTH = {Confidence.VERIFIED: 2, Confidence.PARTIAL: 1, Confidence.UNVERIFIED: 0}


def weakest(confidences: Iterable[Confidence]) -> Confidence:
    """The weakest of ``confidences`` (``unverified`` if there are none)."""
    found = list(confidences)
    if not found:
        return Confidence.UNVERIFIED
    return min(found, key=lambda c: c.strength)


def comparison_digest(output: Any, compare: Sequence[str] = ()) -> str:
    """Hex SHA-256 of what is compared: the canonical JSON of ``output``, or of
    ``{path: value}`` for the ``compare`` paths (a missing path compares as absent)."""
    if compare:
        picked: dict[str, Any] = {}
        for path in compare:
            try:
                picked[path] = read_path(output, path)
            except KeyError:
                picked[path] = {"$missing": True}
        output = picked
    text = json.dumps(output, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Judgement:
    """What a set of answers to a verified step amounts to.

    Attributes:
        confidence: verified, partial or unverified.
        chosen: Index (into the answers) of the output the step reports: the
            first answer of the largest group of agreeing answers.
        candidates: Indexes of one answer per distinct output, when they disagree.
    """

    confidence: Confidence
    chosen: int
    candidates: tuple[int, ...] = ()


def judge(verify: Verify, digests: Sequence[str]) -> Judgement:
    """Compare the comparison digests of the answers that arrived (in source order).

    Raises:
        ValueError: no answer arrived.
    """
    if not digests:
        raise ValueError("no answers to judge")
    groups: dict[str, list[int]] = {}
    for index, digest in enumerate(digests):
        groups.setdefault(digest, []).append(index)
    largest = max(groups.values(), key=len)  # ties: the group seen first
    if len(groups) > 1:
        firsts = tuple(members[0] for members in groups.values())
        return Judgement(Confidence.UNVERIFIED, largest[0], firsts)
    if len(digests) >= verify.quorum:
        return Judgement(Confidence.VERIFIED, 0)
    return Judgement(Confidence.PARTIAL, 0)


def check_deterministic(step_id: str, expect: Expect | None, output: Any) -> None:
    """Run ``expect.equals`` and ``expect.range`` on ``output``.

    Raises:
        ExpectationFailed: a check failed (the message names the path, never the value).
    """
    is_deterministically_verified(step_id, expect, output)


def is_deterministically_verified(step_id: str, expect: Expect | None, output: Any) -> bool:
    """True if ``expect`` has deterministic checks (``equals``, ``range``) and ``output``
    passes them; False if it has none.

    Raises:
        ExpectationFailed: a check failed (the message names the path, never the value).
    """
    if expect is None or not expect.deterministic:
        return False
    for path, wanted in expect.equals.items():
        try:
            found = read_path(output, path)
        except KeyError:
            raise ExpectationFailed(f"step {step_id!r}: output has no {path!r}") from None
        if found != wanted or (type(found) is bool and type(wanted) is not bool):
            raise ExpectationFailed(f"step {step_id!r}: {path!r} is not the expected value")
    for path, bounds in expect.range.items():
        try:
            found = read_path(output, path)
        except KeyError:
            raise ExpectationFailed(f"step {step_id!r}: output has no {path!r}") from None
        if isinstance(found, bool) or not isinstance(found, int | float):
            raise ExpectationFailed(f"step {step_id!r}: {path!r} is not a number")
        if (bounds.min is not None and found < bounds.min) or (
            bounds.max is not None and found > bounds.max
        ):
            raise ExpectationFailed(
                f"step {step_id!r}: {path!r} is outside [{_end(bounds.min)}, {_end(bounds.max)}]"
            )
    return True


def _end(value: float | None) -> str:
    return "open" if value is None else f"{value:g}"
