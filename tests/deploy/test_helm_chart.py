"""The Helm chart (deploy/helm/a2a-gateway): ``helm lint``, and ``helm template`` piped into
``kubernetes-validate``, with every example values file and the one docs/deploy.md shows.

No cluster is needed: helm v4 is built from its Go module by ``scripts/build_helm.sh`` (the
tests skip, saying so, only where Go is absent), and the rendered manifests are checked
against the Kubernetes schemas that kubernetes-validate ships.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config import AgentConfig, TlsFiles, WorkloadApiTls

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "a2a-gateway"
DEPLOY_PAGE = REPO / "docs" / "deploy.md"
EXAMPLES = sorted((CHART / "ci").glob("*.yaml"))
LINTED = "1 chart(s) linted, 0 chart(s) failed"
KINDS = [
    "NetworkPolicy",
    "PodDisruptionBudget",
    "ServiceAccount",
    "ConfigMap",
    "ConfigMap",
    "Service",
    "Deployment",
]


@pytest.fixture(scope="module")
def helm() -> Path:
    """The helm binary, built once into the tools cache if missing."""
    tools = Path(os.environ.get("A2AGW_TOOLS", "/var/cache/a2agw/tools"))
    binary = tools / "helm-4.3.2" / "bin" / "helm"
    if binary.exists():
        return binary
    if not Path("/usr/local/go/bin/go").exists() and shutil.which("go") is None:
        pytest.skip("Go is not installed: helm cannot be built (scripts/build_helm.sh)")
    built = subprocess.run(
        ["bash", str(REPO / "scripts" / "build_helm.sh")],
        capture_output=True,
        text=True,
        timeout=3000,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return Path(built.stdout.strip().splitlines()[-1]) / "helm"


def _page_block(language: str, starting: str) -> str:
    blocks = re.findall(rf"^```{language}\n(.*?)^```", DEPLOY_PAGE.read_text(), re.M | re.S)
    [block] = [b for b in blocks if b.startswith(starting)]
    return block


@pytest.fixture(scope="module")
def page_values(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """docs/deploy.md's alice-values.yaml."""
    path = tmp_path_factory.mktemp("values") / "alice-values.yaml"
    path.write_text(_page_block("yaml", "replicaCount:"))
    return path


def _helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), *args], capture_output=True, text=True, timeout=120, check=False
    )


def render(helm: Path, values: Path, *sets: str, release: str = "alice") -> list[dict[str, Any]]:
    """``helm template RELEASE CHART -f VALUES --set ...`` as documents."""
    args = ["template", release, str(CHART), "-f", str(values)]
    for assignment in sets:
        args += ["--set", assignment]
    result = _helm(helm, *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _one(documents: list[dict[str, Any]], kind: str, suffix: str = "") -> dict[str, Any]:
    [found] = [d for d in documents if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    return found


def _values_files(page_values: Path) -> list[Path]:
    return [*EXAMPLES, page_values]


def test_every_example_values_file_is_here() -> None:
    assert [p.name for p in EXAMPLES] == [
        "postgres-secret-values.yaml",
        "spiffe-csi-values.yaml",
        "sqlite-values.yaml",
    ]


def test_helm_lint_strict_passes_with_each_values_file(helm: Path, page_values: Path) -> None:
    for values in _values_files(page_values):
        result = _helm(helm, "lint", "--strict", str(CHART), "-f", str(values))
        assert result.returncode == 0, result.stdout + result.stderr
        lines = result.stdout.strip().splitlines()
        assert lines[0] == f"==> Linting {CHART}"
        assert [line for line in lines if line.startswith("[")] == [
            "[INFO] Chart.yaml: icon is recommended"
        ]
        assert lines[-1] == LINTED
        print(f"helm lint --strict -f {values.name}:\n{result.stdout}")


def test_helm_lint_fails_without_an_agent_id(helm: Path) -> None:
    result = _helm(helm, "lint", "--strict", str(CHART))
    assert result.returncode == 1
    assert "at '/agent/id': '' does not match pattern" in result.stdout


def test_the_page_lines_render_and_validate(helm: Path, page_values: Path, tmp_path: Path) -> None:
    # The page's two lines as written, in a folder holding the chart and alice-values.yaml.
    block = _page_block("sh", "helm lint --strict deploy/helm/a2a-gateway")
    shutil.copytree(CHART, tmp_path / "deploy" / "helm" / "a2a-gateway")
    shutil.copy(page_values, tmp_path / "alice-values.yaml")
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(helm.parent), str(Path(sys.executable).parent), env["PATH"]])
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    passed = re.findall(r"passed for resource (\S+) against version", result.stdout + result.stderr)
    assert passed == [
        "networkpolicy/alice-a2a-gateway",
        "poddisruptionbudget/alice-a2a-gateway",
        "serviceaccount/alice-a2a-gateway",
        "configmap/alice-a2a-gateway-config",
        "configmap/alice-a2a-gateway-policy",
        "service/alice-a2a-gateway",
        "deployment/alice-a2a-gateway",
    ]


def test_every_rendering_validates_strictly(helm: Path, page_values: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    version = kubernetes_validate.utils.latest_version()
    for values in _values_files(page_values):
        documents = render(helm, values)
        expected = (
            [k for k in KINDS if k != "PodDisruptionBudget"] if "sqlite" in values.name else KINDS
        )
        assert [d["kind"] for d in documents] == expected, values.name
        for document in documents:
            kubernetes_validate.validate(document, version, strict=True)  # raises if invalid
    deployment = _one(render(helm, page_values), "Deployment")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "grpc"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)  # the validator can fail


def _agent_config(documents: list[dict[str, Any]]) -> AgentConfig:
    config_map = _one(documents, "ConfigMap", "-config")
    return AgentConfig.model_validate(tomllib.loads(config_map["data"]["agent.toml"]))


def _mounts(documents: list[dict[str, Any]]) -> dict[str, str]:
    [container] = _one(documents, "Deployment")["spec"]["template"]["spec"]["containers"]
    return {m["mountPath"]: m["name"] for m in container["volumeMounts"]}


def test_the_config_map_holds_a_valid_config_that_matches_the_pod(
    helm: Path, page_values: Path
) -> None:
    documents = render(helm, page_values)
    config = _agent_config(documents)
    assert config.id == "spiffe://example.org/agent/alice"
    assert str(config.audit_db) == str(config.state_db)
    assert str(config.audit_db) == "postgresql://a2agw@postgres.db.svc:5432/a2agw"
    assert isinstance(config.tls, TlsFiles)
    mounts = _mounts(documents)
    assert mounts["/etc/a2a-gateway/pki"] == "pki"
    assert {str(config.tls.ca), str(config.tls.cert), str(config.tls.key)} == {
        "/etc/a2a-gateway/pki/ca.crt",
        "/etc/a2a-gateway/pki/tls.crt",
        "/etc/a2a-gateway/pki/tls.key",
    }
    assert str(config.policy) == "/etc/a2a-gateway/policy/policy.toml"
    assert mounts["/etc/a2a-gateway/policy"] == "policy"  # a folder: edits arrive in place
    assert config.metrics is not None and config.metrics.listen == "0.0.0.0:9464"
    assert config.a2a.grpc_address == "alice-a2a-gateway:7001"
    policy = _one(documents, "ConfigMap", "-policy")["data"]["policy.toml"]
    assert tomllib.loads(policy)["grants"][0]["peer"] == "spiffe://example.org/agent/bob"
    deployment = _one(documents, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 7001, "metrics": 9464}
    assert container["args"] == ["serve", "--config", "/etc/a2a-gateway/agent.toml"]
    assert container["image"] == "registry.example.org/a2a-gateway:0.1.0"
    assert deployment["spec"]["replicas"] == 2


def test_the_pod_is_locked_down_and_probed(helm: Path, page_values: Path) -> None:
    pod = _one(render(helm, page_values), "Deployment")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "fsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    probes = {
        kind: container[kind]["httpGet"]
        for kind in ("startupProbe", "readinessProbe", "livenessProbe")
    }
    assert probes == {
        "startupProbe": {"path": "/readyz", "port": "metrics"},
        "readinessProbe": {"path": "/readyz", "port": "metrics"},
        "livenessProbe": {"path": "/healthz", "port": "metrics"},
    }
    assert container["env"] == [
        {
            "name": "PGPASSWORD",
            "valueFrom": {"secretKeyRef": {"name": "a2a-gateway-postgres", "key": "password"}},
        }
    ]
    [pki] = [v for v in pod["volumes"] if v["name"] == "pki"]
    assert pki["secret"]["secretName"] == "alice-a2a-gateway-tls"
    assert pki["secret"]["defaultMode"] == 0o400


def test_the_spiffe_csi_driver_replaces_the_secret(helm: Path) -> None:
    documents = render(helm, CHART / "ci" / "spiffe-csi-values.yaml", release="bob")
    config = _agent_config(documents)
    assert isinstance(config.tls, WorkloadApiTls)
    assert config.tls.socket == "unix:///spiffe-workload-api/spire-agent.sock"
    assert [p.id for p in config.peers] == ["spiffe://example.org/agent/alice"]
    pod = _one(documents, "Deployment")["spec"]["template"]["spec"]
    assert [v["csi"] for v in pod["volumes"] if "csi" in v] == [
        {"driver": "csi.spiffe.io", "readOnly": True}
    ]
    assert [v for v in pod["volumes"] if "secret" in v] == []
    assert _mounts(documents)["/spiffe-workload-api"] == "spiffe-workload-api"
    assert pod["serviceAccountName"] == "bob-a2a-gateway"  # what SPIRE's k8s selectors name


def test_the_disruption_budget_and_network_policy_select_the_agent_pods(
    helm: Path, page_values: Path
) -> None:
    documents = render(helm, page_values)
    labels = _one(documents, "Deployment")["spec"]["selector"]["matchLabels"]
    budget = _one(documents, "PodDisruptionBudget")["spec"]
    assert budget == {"maxUnavailable": 1, "selector": {"matchLabels": labels}}
    policy = _one(documents, "NetworkPolicy")["spec"]
    assert policy["podSelector"] == {"matchLabels": labels}
    assert policy["policyTypes"] == ["Ingress"]  # egress not restricted unless asked
    assert [rule["ports"] for rule in policy["ingress"]] == [
        [{"protocol": "TCP", "port": "grpc"}],
        [{"protocol": "TCP", "port": "metrics"}],
    ]
    limited = _one(render(helm, CHART / "ci" / "spiffe-csi-values.yaml"), "NetworkPolicy")
    assert limited["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert [rule["ports"] for rule in limited["spec"]["egress"]] == [
        [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        [{"port": 5432, "protocol": "TCP"}],
        [{"port": 7001, "protocol": "TCP"}],
    ]


def test_a_policy_edit_does_not_roll_the_pods_but_a_config_edit_does(
    helm: Path, page_values: Path
) -> None:
    def checksum(*sets: str) -> str:
        deployment = _one(render(helm, page_values, *sets), "Deployment")
        return str(deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    first = checksum()
    assert checksum("policy=version = 1") == first
    assert checksum("agent.modules={capabilities.builtin,my.capabilities}") != first


@pytest.mark.parametrize(
    ("sets", "error"),
    [
        (
            ["postgres.dsn="],
            "replicaCount > 1 needs postgres.dsn: replicas of one agent id share their audit"
            " chain, idempotency keys and replay window only through PostgreSQL",
        ),
        (
            ["postgres.dsn=", "replicaCount=1"],
            "without postgres.dsn the audit log is a SQLite file: set state.existingClaim so it"
            " outlives the pod",
        ),
        (
            ["postgres.dsn=postgresql://a2agw:secret@postgres.db.svc:5432/a2agw"],
            "at '/postgres/dsn'",
        ),
        (["tls.source=files"], "at '/tls/source'"),
        (["agent.id=alice"], "at '/agent/id'"),
    ],
)
def test_values_that_cannot_run_safely_are_refused(
    helm: Path, page_values: Path, sets: list[str], error: str
) -> None:
    args = ["template", "alice", str(CHART), "-f", str(page_values)]
    for assignment in sets:
        args += ["--set", assignment]
    result = _helm(helm, *args)
    assert result.returncode == 1
    assert error in result.stderr
