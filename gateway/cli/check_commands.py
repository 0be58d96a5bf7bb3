"""``config check`` and ``plan check``: find problems before an agent starts or a task runs.

Each prints one line per finding (``ok:``, ``warning:`` or ``error:``, then
what it is about) and exits 1 if any finding is an error. Nothing is served,
written or called: capability modules register into a throw-away registry
with a scratch state folder, and ``plan check`` creates no task. Only
``config check --reach`` opens connections (TCP only, to the configured
peers and upstreams), and ``config check`` of an agent whose certificate
comes from the SPIFFE Workload API asks that API, as ``serve`` would.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from spiffe.errors import PySpiffeError

from capabilities.loading import AgentEnvironment, CapabilityModuleError, load_capability_modules
from capabilities.registry import CapabilityRegistry
from capabilities.versions import VersionConstraint
from gateway.config import AgentConfig, TlsFiles, TlsSettings, WorkloadApiTls, load_agent_config
from gateway.config.fields import expiry_window
from gateway.display import printable
from gateway.errors import ConfigError, GatewayError
from gateway.local.regular_files import read_regular_file
from gateway.plans.document.checks import PlanLimits, check_structure
from gateway.plans.document.model import Plan, parse_plan
from gateway.transport.svid_checks import check_material
from gateway.transport.tls import TlsMaterial
from gateway.transport.workload_api import fetch_material, workload_api_socket
from policies.identity import svid_dns_name
from policies.policy_file import Policy, load_policy

EXIT_PROBLEMS = 1
_REACH_TIMEOUT = 3.0
_WORKLOAD_API_TIMEOUT = 3.0

Level = Literal["ok", "warning", "error"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One line of a check's report."""

    level: Level
    subject: str
    message: str

    def line(self) -> str:
        """``level: subject: message``, escaped into one line."""
        return f"{self.level}: {printable(self.subject)}: {printable(self.message)}"


def add_commands(commands: Any) -> None:
    """Register ``config check`` and ``plan check``."""
    config = commands.add_parser("config", help="agent config files")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = config_sub.add_parser(
        "check", help="config, policy, certificates, capability modules (and reachability)"
    )
    check.add_argument("--config", type=Path, required=True, help="agent config (TOML)")
    check.add_argument(
        "--reach", action="store_true", help="also open a TCP connection to each peer and upstream"
    )
    check.set_defaults(run=_config_check)

    plan = commands.add_parser("plan", help="plan documents")
    plan_sub = plan.add_subparsers(dest="plan_command", required=True, metavar="ACTION")
    plan_check = plan_sub.add_parser(
        "check", help="static checks of a plan against an agent (no task is created)"
    )
    plan_check.add_argument("plan", type=Path, help="plan document (JSON)")
    plan_check.add_argument("--config", type=Path, required=True, help="agent config (TOML)")
    plan_check.set_defaults(run=_plan_check)


def _report(findings: list[Finding]) -> int:
    for finding in findings:
        print(finding.line())
    return EXIT_PROBLEMS if any(f.level == "error" for f in findings) else 0


def _errors(subject: str, err: GatewayError) -> list[Finding]:
    """A ConfigError's message, one finding per problem line (each line's own leading
    ``subject:`` dropped: the finding names it once)."""
    return [
        Finding("error", subject, line.strip().removeprefix(f"{subject}: "))
        for line in err.message.split("\n")
        if line.strip()
    ]


def _config_check(args: argparse.Namespace) -> int:
    try:
        config = load_agent_config(args.config)
    except ConfigError as err:
        return _report(_errors(str(args.config), err))
    findings = [Finding("ok", str(args.config), f"agent {config.id}, listen {config.listen}")]
    policy = _check_policy(config, findings)
    _check_certificate(config, findings)
    registry = _check_modules(config, findings)
    if policy is not None:
        findings.extend(_policy_against(config, policy, registry))
    if args.reach:
        findings.extend(asyncio.run(_reachability(config)))
    return _report(findings)


def _check_policy(config: AgentConfig, findings: list[Finding]) -> Policy | None:
    subject = f"policy {config.policy}"
    try:
        policy = load_policy(config.policy)
    except ConfigError as err:
        findings.extend(_errors(subject, err))
        return None
    document, now = policy.document, datetime.now(UTC)
    findings.append(
        Finding(
            "ok", subject, f"{len(document.grants)} grants, {len(document.outbound)} outbound rules"
        )
    )
    expired = [grant for grant in document.grants if grant.expires_at <= now]
    for grant in expired:
        findings.append(
            Finding("warning", subject, f"grant of {grant.peer} expired {grant.expires_at}")
        )
    if document.grants and len(expired) == len(document.grants):
        findings.append(
            Finding("error", subject, "every grant has expired: health says NOT_SERVING")
        )
    return policy


def _check_certificate(config: AgentConfig, findings: list[Finding]) -> None:
    if not isinstance(config.tls, TlsFiles):
        findings.extend(_workload_api_findings(config.id, config.tls))
        return
    subject = f"certificate {config.tls.cert}"
    try:
        material = TlsMaterial.from_files(config.tls.ca, config.tls.cert, config.tls.key)
    except ConfigError as err:
        findings.extend(_errors(subject, err))
        return
    findings.extend(_material_findings(config.id, material, config.tls, subject))


def _material_findings(
    agent_id: str, material: TlsMaterial, tls: TlsSettings, subject: str, source: str = ""
) -> list[Finding]:
    """What the agent would say of ``material`` at start: accepted, when it expires, and
    whether it carries the optional derived DNS name (``source`` opens the first line)."""
    now = datetime.now(UTC)
    try:
        facts = check_material(material, agent_id, now)
    except ConfigError as err:
        return _errors(subject, err)
    left = facts.not_after - now
    window = expiry_window(tls.expiry_warning, facts.not_before, facts.not_after)
    level: Level = "warning" if left <= window else "ok"
    found = [
        Finding(
            level,
            subject,
            f"{source}{agent_id}, expires {facts.not_after.isoformat()} ({_span(left)} left, "
            f"warned within {_span(window)})",
        )
    ]
    if not facts.derived_name:
        found.append(
            Finding(
                "ok",
                subject,
                f"carries only its SPIFFE ID (no DNS name {svid_dns_name(agent_id)}): "
                "gateway clients pin the URI SAN; a gRPC client that can verify only a "
                "host name needs that name (docs/other-languages.md)",
            )
        )
    return found


def _span(span: timedelta) -> str:
    seconds = max(0, int(span.total_seconds()))
    if seconds >= 2 * 86400:
        return f"{seconds // 86400}d"
    if seconds >= 2 * 3600:
        return f"{seconds // 3600}h"
    if seconds >= 120:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def _workload_api_findings(agent_id: str, tls: WorkloadApiTls) -> list[Finding]:
    """Where the SVID will come from, and what the Workload API gives this process now.

    An error if ``serve`` would find no address (no ``socket`` and no
    ``SPIFFE_ENDPOINT_SOCKET`` here) or the API answers without an SVID for the
    agent; a warning if no socket is there now or it does not answer.
    """
    try:
        socket = workload_api_socket(tls.socket)
    except ConfigError as err:
        return [Finding("error", "certificate", err.message)]
    source = f"from the SPIFFE Workload API ({socket}): "
    if not Path(socket.removeprefix("unix://")).is_socket():
        return [
            Finding(
                "warning",
                "certificate",
                f"{source}no socket there now (is the SPIRE agent running?)",
            )
        ]
    try:
        material = fetch_material(socket, agent_id, _WORKLOAD_API_TIMEOUT)
    except PySpiffeError as err:
        return [
            Finding(
                "warning",
                "certificate",
                f"{source}no answer within {_WORKLOAD_API_TIMEOUT:g}s ({err}); "
                "asked again at start",
            )
        ]
    except ConfigError as err:
        return [
            Finding(
                "error",
                "certificate",
                f"{source}{err.message} (entries are selected by the process that asks: "
                "run the check as the agent's user)",
            )
        ]
    return _material_findings(agent_id, material, tls, "certificate", source)


def _check_modules(config: AgentConfig, findings: list[Finding]) -> CapabilityRegistry | None:
    registry = CapabilityRegistry()
    with tempfile.TemporaryDirectory(prefix="a2agw-check-") as scratch:
        try:
            load_capability_modules(
                config.modules,
                registry,
                AgentEnvironment(config.id, Path(scratch)),
                config.module_dir,
            )
        except (CapabilityModuleError, ValueError) as err:
            findings.append(Finding("error", "modules", str(err)))
            return None
    names = ", ".join(f"{cap.name}@{cap.version}" for cap in registry) or "none"
    findings.append(Finding("ok", "modules", f"{len(registry)} capabilities: {names}"))
    return registry


def _policy_against(
    config: AgentConfig, policy: Policy, registry: CapabilityRegistry | None
) -> Iterator[Finding]:
    """Grants naming capabilities nobody serves; outbound rules to unknown peers."""
    served = {skill.capability for up in config.upstreams for skill in up.skills}
    if registry is not None:
        served |= {cap.name for cap in registry}
        for grant in policy.document.grants:
            for entry in grant.capabilities:
                if entry.name not in served:
                    yield Finding(
                        "warning",
                        f"policy {config.policy}",
                        f"grant of {grant.peer} names {entry.name}, not served here",
                    )
    peers = {peer.id for peer in config.peers}
    for rule in policy.document.outbound:
        if rule.peer not in peers:
            yield Finding(
                "warning",
                f"policy {config.policy}",
                f"outbound rule for {rule.peer}, which is not in [[peers]]",
            )


async def _reachability(config: AgentConfig) -> list[Finding]:
    targets = [(f"peer {peer.id}", peer.address) for peer in config.peers]
    for upstream in config.upstreams:
        address = upstream.address or _url_address(upstream.url or "")
        targets.append((f"upstream {upstream.name}", address))
    return list(await asyncio.gather(*(_reach(subject, address) for subject, address in targets)))


def _url_address(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _reach(subject: str, address: str) -> Finding:
    host, _, port = address.rpartition(":")
    try:
        async with asyncio.timeout(_REACH_TIMEOUT):
            _, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    except (OSError, ValueError, TimeoutError) as err:
        why = (
            "no answer within 3s"
            if isinstance(err, TimeoutError)
            else str(err) or type(err).__name__
        )
        return Finding("error", subject, f"{address} unreachable: {why}")
    writer.close()
    return Finding("ok", subject, f"{address} accepts connections")


def _plan_check(args: argparse.Namespace) -> int:
    config = load_agent_config(args.config)
    findings: list[Finding] = []
    try:
        text = read_regular_file(args.plan)
    except OSError as err:
        raise ConfigError(f"{args.plan}: plan file unreadable: {err.strerror or err}") from err
    try:
        plan = parse_plan(text, str(args.plan))
        check_structure(plan, PlanLimits())
    except ConfigError as err:
        return _report(_errors(str(args.plan), err))
    findings.append(Finding("ok", str(args.plan), f"{len(plan.steps)} steps, structure valid"))
    policy = load_policy(config.policy)
    registry = _check_modules(config, [])
    findings.extend(_step_routes(plan, config, policy, registry or CapabilityRegistry()))
    return _report(findings)


def _step_routes(
    plan: Plan, config: AgentConfig, policy: Policy, registry: CapabilityRegistry
) -> Iterator[Finding]:
    """Where each step could run, judged from this agent's files alone (no peer is asked)."""
    upstream = {skill.capability: skill for up in config.upstreams for skill in up.skills}
    for step in plan.steps:
        subject = f"step {step.id}"
        local = registry.resolve(step.capability, VersionConstraint.parse(step.version))
        risk = local.contract.risk if local is not None else None
        if local is None and step.capability in upstream:
            risk = upstream[step.capability].risk
        peers = [p.id for p in config.peers if policy.may_send(p.id, step.capability)]
        wanted = f"{step.capability}@{step.version or '*'}"
        if risk is not None and risk.rank > plan.max_risk.rank:
            yield Finding(
                "error",
                subject,
                f"{wanted} has risk {risk.value}; the plan allows up to {plan.max_risk.value}",
            )
        elif risk is not None:
            yield Finding("ok", subject, f"{wanted} runs here (risk {risk.value})")
        elif peers:
            yield Finding(
                "ok",
                subject,
                f"{wanted} may be sent to {', '.join(peers)} (their offers not asked)",
            )
        else:
            yield Finding(
                "error",
                subject,
                f"no local capability offers {wanted} and no outbound rule lets it go to a peer",
            )
