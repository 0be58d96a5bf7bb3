"""A step's answer, and the checks an answer must pass before the plan may use it.

Remote outputs are untrusted: the peer's evidence digest, served version and
output schema are checked here before the output becomes a step result.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

from gateway.client.peer_client import InvokeResult
from gateway.errors import ExpectationFailed, InvalidOutput
from gateway.outbound.router import Offer
from gateway.plans.document.model import Step
from gateway.plans.document.schema import SchemaMismatch, check_schema
from gateway.plans.execution.verification import Confidence, check_deterministic
from gateway.plans.task import Evidence


@dataclass(frozen=True, slots=True)
class StepAnswer:
    """What one route answered, with its evidence (and a quorum's, when verified)."""

    output: Any
    evidence: Evidence
    remembered: bool
    confidence: Confidence = Confidence.UNVERIFIED
    sources: tuple[Evidence, ...] = ()
    candidates: tuple[Any, ...] = ()


def check_expect(step: Step, output: Any) -> None:
    """Check ``output`` against the step's ``expect`` (schema, deterministic rules).

    Raises:
        ExpectationFailed: the output does not satisfy ``expect``.
    """
    if step.expect is None:
        return
    if step.expect.json_schema is not None:
        try:
            check_schema(output, step.expect.json_schema)
        except SchemaMismatch as err:
            raise ExpectationFailed(
                f"step {step.id!r} output does not satisfy expect: {err}"
            ) from err
    check_deterministic(step.id, step.expect, output)


def deterministic(step: Step) -> bool:
    """True if the step declares its output deterministic (checked, so verified)."""
    return step.expect is not None and step.expect.deterministic


def peer_answer(step: Step, offer: Offer, result: InvokeResult) -> StepAnswer:
    """The step's answer from a peer's reply, once digest, version and schema check out.

    Raises:
        InvalidOutput: the digest does not match the output, another version
            served it, or the output violates the advertised output schema.
    """
    digest = hashlib.sha256(result.payload).hexdigest()
    if digest != result.evidence_sha256:
        raise InvalidOutput("the peer's evidence digest does not match its output")
    if result.served_version != str(offer.version):
        raise InvalidOutput(f"asked for {offer.version}, served {result.served_version}")
    try:
        output = json.loads(result.payload)
        check_schema(output, offer.output_schema)
    except (ValueError, SchemaMismatch) as err:
        raise InvalidOutput(f"peer output violates the contract: {err}") from err
    except RecursionError as err:  # JSON nested deeper than the parser can follow
        raise InvalidOutput("peer output violates the contract: it nests too deeply") from err
    evidence = Evidence(step.id, offer.where, result.served_version, now_ms(), digest)
    return StepAnswer(output, evidence, result.remembered)


def now_ms() -> int:
    """Wall-clock milliseconds (the time an answer's evidence is stamped with)."""
    return int(time.time() * 1000)
