"""Which version a route serves: the static check and the run-time choice agree.

bob describes ``x`` 1.0.0 (read) and 2.0.0 (write); alice's outbound rules are a
real policy file; bob's client is a fake that only answers Describe.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from capabilities.contract import Risk
from capabilities.registry import CapabilityRegistry
from capabilities.versions import Version, VersionConstraint
from gateway.client.peer_client import PeerDescription, RemoteCapability
from gateway.errors import PlanInvalid
from gateway.outbound.router import Offer, Router, Skipped, select_routes
from gateway.plans import Plan, check_routes
from policies.store import PolicyStore
from tests.helpers.agents import outbound_rule, spiffe, write_policy

BOB = spiffe("bob")


class TwoVersions:
    async def describe(self, *, timeout: float = 5.0) -> PeerDescription:
        caps = tuple(
            RemoteCapability("x", version, risk, 1.0, False, "", {"properties": {}}, {}, (), ())
            for version, risk in (("1.0.0", "read"), ("2.0.0", "write"))
        )
        return PeerDescription(BOB, "a2agw.v1", caps, 1024, "")


def router(tmp_path: Path, rule: str) -> Router:
    policy = write_policy(tmp_path / "policy.toml", [], [outbound_rule("bob", [rule])])
    return Router(
        registry=CapabilityRegistry(),
        policies=PolicyStore(policy),
        peers=[BOB],
        client_for=lambda _peer_id: TwoVersions(),  # type: ignore[arg-type, return-value]
    )


def plan(version: str, max_risk: str = "write") -> Plan:
    step = {"id": "a", "capability": "x", "version": version}
    return Plan.model_validate({"goal": "g", "max_risk": max_risk, "steps": [step]})


@pytest.mark.parametrize(
    ("rule", "step_version", "max_risk", "served"),
    [
        ("x@^1", "", "write", "1.0.0"),  # the rule caps it: 2.0.0 is not a route
        ("x", "", "write", "2.0.0"),
        ("x", "", "read", "1.0.0"),  # the task's risk caps it the same way
        ("x", "^1", "write", "1.0.0"),
        ("x@^2", "^2", "write", "2.0.0"),
    ],
)
async def test_static_check_and_run_time_pick_the_same_version(
    tmp_path: Path, rule: str, step_version: str, max_risk: str, served: str
) -> None:
    routes = router(tmp_path, rule)
    work = plan(step_version, max_risk)
    step = work.steps[0]
    catalog, skipped = await routes.catalog(["x"])
    check_routes(work, catalog, skipped=skipped)  # passes
    static = select_routes(catalog["x"], step.constraint, avoid=step.avoid, max_risk=work.max_risk)
    offers, passed_over = await routes.offers(
        "x", step.constraint, avoid=step.avoid, max_risk=work.max_risk
    )
    assert [(o.where, str(o.version)) for o in offers] == [(BOB, served)]
    assert offers == static and passed_over == []


@pytest.mark.parametrize(("rule", "step_version"), [("x@^1", "^2"), ("x@^2", "^1")])
async def test_a_version_only_the_rule_refuses_has_no_route_either_way(
    tmp_path: Path, rule: str, step_version: str
) -> None:
    routes = router(tmp_path, rule)
    work = plan(step_version)
    catalog, skipped = await routes.catalog(["x"])
    with pytest.raises(PlanInvalid):
        check_routes(work, catalog, skipped=skipped)
    offers, passed_over = await routes.offers("x", work.steps[0].constraint)
    assert offers == [] and passed_over == [Skipped(BOB, "OUTBOUND_NOT_ALLOWED")]


def test_select_routes_filters_before_it_takes_the_highest() -> None:
    def offer(version: str, where: str) -> Offer:
        return Offer("x", Version.parse(version), Risk.READ, False, where, frozenset(), {})

    offers = [offer("2.0.0", BOB), offer("1.2.0", BOB), offer("1.5.0", "local")]
    only_1_2 = VersionConstraint.parse("<2")

    def below_1_3(o: Offer) -> bool:
        return o.version < Version.parse("1.3.0")

    chosen = select_routes(offers, only_1_2, permitted=below_1_3)
    assert [(o.where, str(o.version)) for o in chosen] == [(BOB, "1.2.0")]
    assert select_routes(offers, only_1_2, avoid=[BOB]) == [offers[2]]
