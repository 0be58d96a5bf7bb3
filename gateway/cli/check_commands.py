"""``config check`` and ``plan check``: find problems before an agent starts or a task runs.

Each prints one line per finding (``ok:``, ``warning:`` or ``error:``, then
what it is about) and exits 1 if any finding is an error. Nothing is served,
written or called: capability modules register into a throw-away registry
with a scratch state folder, and ``plan check`` creates no task. Only
``config check --reach`` opens connections (TCP only, to the configured
peers and upstreams).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from cryptography import x509

from capabilities.loading import AgentEnvironment, CapabilityModuleError, load_capability_modules
from capabilities.registry import CapabilityRegistry
from capabilities.versions import VersionConstraint
from gateway.config import AgentConfig, TlsFiles, WorkloadApiTls, load_agent_config
from gateway.display import printable
from gateway.errors import ConfigError, GatewayError
from gateway.local.regular_files import read_regular_file
from gateway.plans.document.checks import PlanLimits, check_structure
from gateway.plans.document.model import Plan, parse_plan
from gateway.transport.svid_checks import check_material, require_svid_dns_name
from gateway.transport.tls import TlsMaterial
from gateway.transport.workload_api import workload_api_socket
from policies.identity import svid_dns_name
from policies.policy_file import Policy, load_policy

EXIT_PROBLEMS = 1
_REACH_TIMEOUT = 3.0

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
        findings.append(_workload_api_finding(config.tls))
        return
    subject = f"certificate {config.tls.cert}"
    now = datetime.now(UTC)
    try:
        material = TlsMaterial.from_files(config.tls.ca, config.tls.cert, config.tls.key)
        facts = check_material(material, config.id, now)
    except ConfigError as err:
        findings.extend(_errors(subject, err))
        return
    try:  # the leaf check_material has just read: only its DNS name is looked at here
        require_svid_dns_name(x509.load_pem_x509_certificate(material.cert_pem), config.id)
    except ConfigError:
        findings.append(
            Finding(
                "warning",
                subject,
                f"lacks the DNS name {svid_dns_name(config.id)} that peers verify "
                f"{config.id} by: every caller will fail PEER_IDENTITY_MISMATCH "
                "(a2a-gateway pki issue adds it)",
            )
        )
    left = facts.not_after - now
    level: Level = "warning" if left <= config.tls.expiry_warning else "ok"
    findings.append(
        Finding(
            level, subject, f"{config.id}, expires {facts.not_after.isoformat()} ({left.days}d)"
        )
    )


def _workload_api_finding(tls: WorkloadApiTls) -> Finding:
    """Where the SVID will come from: an error if ``serve`` would find no address (no
    ``socket`` and no ``SPIFFE_ENDPOINT_SOCKET`` here), a warning if no socket is there now.
    The SVID itself is checked at start."""
    try:
        socket = workload_api_socket(tls.socket)
    except ConfigError as err:
        return Finding("error", "certificate", err.message)
    if not Path(socket.removeprefix("unix://")).is_socket():
        return Finding(
            "warning",
            "certificate",
            f"from the SPIFFE Workload API ({socket}): no socket there now "
            "(is the SPIRE agent running?)",
        )
    return Finding(
        "ok", "certificate", f"from the SPIFFE Workload API ({socket}), checked at start"
    )


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
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(host.strip("[]"), int(port)), _REACH_TIMEOUT
        )
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
