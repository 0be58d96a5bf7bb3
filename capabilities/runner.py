"""Running one capability: timeout, cancellation and output validation."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, Final

from pydantic import BaseModel, ValidationError

from capabilities.canonical import CanonicalJson, canonical_json
from capabilities.context import CallContext
from capabilities.parts import MessageReply, TaskReply
from capabilities.registry import Capability
from capabilities.replies import REPLY_KEY, checked_reply, reply_json
from gateway.errors import (
    CapabilityFailed,
    CapabilityTimeout,
    DeadlineExceeded,
    GatewayError,
    InvalidOutput,
    OutputChunksTooLarge,
    UpstreamUnavailable,
)

_log = logging.getLogger(__name__)

NOT_STARTED = "capability not started"
"""Audit detail of a DeadlineExceeded raised before the capability ran."""


# Final fields, not frozen: see CONTRIBUTING.md, "Value classes built per call".
@dataclass(slots=True, unsafe_hash=True)
class CapabilityResult:
    """A validated output, ready for the wire.

    Attributes:
        payload: Canonical JSON bytes of the output (a :class:`CanonicalJson`
            when made by :meth:`from_output`: its ``value`` is the output).
        evidence_sha256: Hex SHA-256 of ``payload``.
    """

    payload: Final[bytes]
    evidence_sha256: Final[str]

    @classmethod
    def from_output(cls, output: dict[str, Any]) -> CapabilityResult:
        """Canonicalise a validated output dict (kept with its bytes) and digest it."""
        payload = CanonicalJson.of(output)
        return cls(payload=payload, evidence_sha256=hashlib.sha256(payload).hexdigest())


async def run_capability(cap: Capability, payload: BaseModel, ctx: CallContext) -> CapabilityResult:
    """Run ``cap`` within its timeout and the call's deadline; validate its output.

    Raises:
        CapabilityTimeout: the contract timeout elapsed first.
        DeadlineExceeded: the call's deadline elapsed first.
        InvalidOutput: the output violates the contract's output model, or cannot
            be read as JSON at all.
        UpstreamUnavailable: ``cap`` fronts an upstream A2A agent and could not reach it.
        CapabilityFailed: the capability raised (details are logged, not returned).
    """
    contract = cap.contract
    remaining = ctx.deadline - time.monotonic()
    budget = min(contract.timeout_seconds, remaining)
    if budget <= 0:
        raise DeadlineExceeded(
            "the call's deadline passed before the capability started", detail=NOT_STARTED
        )
    when = asyncio.get_running_loop().time() + budget
    try:
        output = await _within(cap.handler(payload, ctx), when)
    except TimeoutError as err:
        if contract.timeout_seconds <= remaining:
            raise CapabilityTimeout(
                f"{contract.key} exceeded its {contract.timeout_seconds:g}s timeout"
            ) from err
        raise DeadlineExceeded(f"{contract.key} did not finish before the deadline") from err
    except GatewayError as err:
        if _reports_own_upstream(cap, err):
            raise
        # Raised inside the capability (e.g. by a nested ctx.call_peer): passing
        # it on unchanged would make a refusal by some further peer look like
        # this agent's own policy answer, and hide that the capability ran.
        if isinstance(err, OutputChunksTooLarge):  # its own output, through ctx.emit_chunk
            said = "its output chunks exceed the caller's cap"
        else:
            said = f"a call it made was answered {err.reason}"
        raise CapabilityFailed(f"{contract.key} failed: {said}", detail=err.reason) from err
    except Exception as err:
        _log.warning(
            "capability %s raised %s",
            contract.key,
            type(err).__name__,
            extra={"capability": contract.name, "reason": CapabilityFailed.reason},
        )
        raise CapabilityFailed(f"{contract.key} failed") from err
    try:
        return CapabilityResult.from_output(_validated_output(cap, output))
    except GatewayError:
        raise
    except Exception as err:  # e.g. a model whose own serializer raises: never UNKNOWN
        _log.warning(
            "capability %s returned output that could not be read: %s",
            contract.key,
            type(err).__name__,
            extra={"capability": contract.name, "reason": InvalidOutput.reason},
        )
        raise InvalidOutput(
            f"{contract.key} returned output that cannot be read as JSON ({type(err).__name__})"
        ) from err


async def _within(work: Awaitable[Any], when: float) -> Any:
    """``await work`` with a timeout at ``when`` (loop time), raising TimeoutError.

    The first step runs at once, outside any timer: most capabilities finish
    without ever suspending, and for them arming and cancelling an
    ``asyncio.timeout`` (a timer handle on the loop's heap) was a tenth of
    the allowed call's Python work. Nothing can interrupt a step that does
    not suspend anyway; a capability that does suspend continues under a
    timeout at the same ``when``, so it fires at the same moment as before
    (at once if the first step already used the budget up).
    """
    if not isinstance(work, Coroutine):  # some other awaitable: no first step to take
        async with asyncio.timeout_at(when):
            return await work
    try:
        suspended_on = work.send(None)
    except StopIteration as done:
        return done.value
    async with asyncio.timeout_at(when):
        return await _Resumed(work, suspended_on)


class _Resumed:
    """Awaits a coroutine that already ran its first step and is suspended on ``first``."""

    __slots__ = ("_coro", "_first")

    def __init__(self, coro: Coroutine[Any, Any, Any], first: Any) -> None:
        self._coro, self._first = coro, first

    def __await__(self) -> Generator[Any, None, Any]:
        try:
            # Hand what the coroutine waits on to the Task, as its own await would.
            yield self._first
        except GeneratorExit:
            self._coro.close()
            raise
        except BaseException as exc:  # cancellation (the timeout): into the coroutine
            try:
                suspended_on = self._coro.throw(exc)
            except StopIteration as done:
                return done.value
            return (yield from _Resumed(self._coro, suspended_on).__await__())
        # A Task resumes a coroutine with send(None); ``yield from`` does the same.
        return (yield from self._coro.__await__())


def _reports_own_upstream(cap: Capability, err: GatewayError) -> bool:
    # The one exception to "a gateway error raised inside a capability is
    # CAPABILITY_FAILED": a capability built for an upstream A2A agent saying
    # that very agent could not be reached. Anything else (another reason code,
    # another upstream, a capability that fronts nothing) stays hidden, so no
    # capability can dress up its failure as a policy answer of this agent.
    return (
        isinstance(err, UpstreamUnavailable)
        and bool(cap.upstream)
        and (err.upstream == cap.upstream)
    )


def _validated_output(cap: Capability, output: Any) -> dict[str, Any]:
    """The canonical JSON object of ``output``: an output object, or a reply
    (:mod:`capabilities.replies`), checked against the contract."""
    contract = cap.contract
    if isinstance(output, (TaskReply, MessageReply)):
        try:
            checked = checked_reply(output, contract.gives, lambda data: _validated(cap, data))
        except ValueError as err:  # what the contract does not give: named, never quoted
            raise InvalidOutput(f"{contract.key} returned {err}") from err
        return reply_json(checked)
    if not (contract.gives.tasks and contract.gives.data):
        raise InvalidOutput(f"{contract.key} returned an output object; its contract gives none")
    result = _validated(cap, output)
    if REPLY_KEY in result:  # no model field has this name: only a free-form object can
        raise InvalidOutput(f"{contract.key} returned an object holding the key {REPLY_KEY!r}")
    return result


def _validated(cap: Capability, output: Any) -> dict[str, Any]:
    model = cap.contract.output_model
    # warnings=False: pydantic's warning about a wrongly typed field quotes its value.
    raw = (
        output.model_dump(mode="json", warnings=False) if isinstance(output, BaseModel) else output
    )
    try:
        # Re-validate even model instances: model_construct() and mutation skip checks.
        validated = _strictly_validated(model, raw) if isinstance(raw, dict) else None
    except ValidationError as err:
        raise InvalidOutput(
            f"{cap.contract.key} returned output that violates its contract "
            f"({err.error_count()} problem(s))"
        ) from err
    if validated is None:
        what = "nothing" if output is None else type(output).__name__
        raise InvalidOutput(f"{cap.contract.key} returned {what}, not an object")
    result: dict[str, Any] = validated.model_dump(mode="json")
    return result


def _strictly_validated(model: type[BaseModel], raw: dict[str, Any]) -> BaseModel:
    """``raw`` checked by ``model`` with the model's own strictness, never loosened.

    No coercion: ``"5"`` is no integer, ``1`` no boolean, so the caller gets and
    the digest covers exactly what the capability returned. JSON's own forms
    of strict values (an array for a tuple, a string for a datetime) are read
    as the JSON they are.

    Raises:
        ValidationError: ``raw`` violates the model.
        TypeError, ValueError: ``raw`` is no JSON (the runner says INVALID_OUTPUT).
    """
    try:
        return model.model_validate(raw)
    except ValidationError:
        return model.model_validate_json(canonical_json(raw))
