"""docker-compose.yml, the Dockerfiles and deploy/: what `docker compose up` would run.

No Docker engine runs here, so the checks are static but made on the file as Docker
Compose resolves it (`docker-compose config`, Debian's docker-compose 1.29), plus the
cross-file contracts a stack needs: every deploy/ file mounted, the rules and
Alertmanager config the generators write, Grafana's provisioning pointing at the
mounted dashboards, Prometheus's targets matching the services. Budget: ~2 s.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest
import yaml

from ranksight import cli, triage
from ranksight.dashboards import generate

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DEPLOY = ROOT / "deploy"

IMAGE_PINS = {
    "prom/prometheus": r"v3\.\d+\.\d+",
    "prom/alertmanager": r"v0\.28\.\d+",
    "grafana/grafana": r"12\.\d+\.\d+",
}


def _docker_compose() -> str:
    exe = shutil.which("docker-compose") or "/usr/bin/docker-compose"
    assert Path(exe).exists(), "docker-compose missing: apt-get install docker-compose (scripts/setup does)"
    return exe


def _compose(*args: str, env: Dict[str, str] = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    e.update(env or {})
    return subprocess.run([_docker_compose(), "-f", str(COMPOSE), *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT, env=e)


@pytest.fixture(scope="module")
def resolved() -> dict:
    r = _compose("config")
    assert r.returncode == 0, r.stderr
    return yaml.safe_load(r.stdout)


@pytest.fixture(scope="module")
def services(resolved) -> Dict[str, dict]:
    return resolved["services"]


def _binds(svc: dict) -> List[Tuple[str, str, str]]:
    """(host source, container target, mode) of the service's bind mounts (named volumes excluded)."""
    out = []
    for v in svc.get("volumes", []):
        parts = v.split(":") if isinstance(v, str) else [v["source"], v["target"], "ro" if v.get("read_only") else "rw"]
        if not parts[0].startswith("/"):
            continue  # a named volume
        out.append((parts[0], parts[1], parts[2] if len(parts) > 2 else "rw"))
    return out


def test_compose_config_is_valid():
    r = _compose("config", "-q")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""


def test_compose_config_check_can_fail(tmp_path):
    bad = tmp_path / "docker-compose.yml"
    bad.write_text(COMPOSE.read_text().replace("network_mode: host\n  pid: host", "network_mode: [host]\n  pid: host"))
    r = subprocess.run([_docker_compose(), "-f", str(bad), "config", "-q"], capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert r.returncode != 0


def test_images_are_pinned(services):
    seen = set()
    for name, svc in services.items():
        image = svc.get("image", "")
        repo, _, tag = image.rpartition(":")
        if "build" in svc:
            assert tag and tag != "latest", (name, image)
            continue
        assert repo in IMAGE_PINS, f"{name}: unexpected image {image}"
        assert re.fullmatch(IMAGE_PINS[repo], tag), f"{name}: {image} is not pinned to {IMAGE_PINS[repo]}"
        seen.add(repo)
    assert seen == set(IMAGE_PINS)


def _agents(services) -> Dict[str, dict]:
    return {n: s for n, s in services.items() if s.get("build", {}).get("dockerfile") == "Dockerfile"}


def _flags(svc: dict) -> Dict[str, str]:
    """`ranksight exporter` flags of an agent service (--key=value form)."""
    out = {}
    for arg in svc.get("command", []):
        key, _, value = arg.partition("=")
        assert key.startswith("--") and value, f"write agent flags as --key=value: {arg}"
        out[key[2:]] = value
    return out


def test_agent_sees_the_host(services):
    agents = _agents(services)
    assert agents
    for name, svc in agents.items():
        flags = _flags(svc)
        binds = {target: (src, mode) for src, target, mode in _binds(svc)}
        # network counters of the host: its network namespace, or its PIDs with /proc and --procfs
        host_net = svc.get("network_mode") == "host"
        procfs = flags.get("procfs", "/proc")
        host_proc = svc.get("pid") == "host" and binds.get(procfs) == ("/proc", "ro")
        assert host_net or host_proc, name
        if procfs != "/proc":
            assert binds.get(procfs) == ("/proc", "ro"), f"{name}: procfs {procfs} is not the host's /proc, read-only"
        sysfs = flags.get("sysfs", "/sys")
        assert binds.get(sysfs) == ("/sys", "ro"), f"{name}: sysfs {sysfs} is not the host's /sys, read-only"
        # every bind mount into the agent is read-only
        assert all(mode == "ro" for _, mode in binds.values()), name
        # and `ranksight exporter` takes these flags (the image's entrypoint)
        argv = ["exporter", *svc["command"]]
        args = cli.build_parser(argv).parse_args(argv)
        assert (args.procfs, args.sysfs) == (procfs, sysfs)


def test_gpus_only_in_a_profile(services):
    raw = yaml.safe_load(COMPOSE.read_text())
    default = dict(line.split("=", 1) for line in (ROOT / ".env").read_text().splitlines()
                   if line and not line.startswith("#"))["COMPOSE_PROFILES"].split(",")
    gpu = []
    for name, svc in services.items():
        devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        if any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices):
            gpu.append(name)
            assert svc.get("profiles"), f"{name} reserves GPUs outside a profile: a CPU-only host could not start"
            assert not set(svc["profiles"]) & set(default), f"{name} runs in the default profiles"
            assert "gpu" in _flags(svc)["collectors"].split(",")
    assert gpu, "no service gets the GPUs"
    # the default profiles start one agent (without the GPU collector), the trainer and the stack
    started = [n for n, s in raw["services"].items() if not s.get("profiles") or set(s["profiles"]) & set(default)]
    agents = [n for n in started if n in _agents(services)]
    assert len(agents) == 1 and "gpu" not in _flags(services[agents[0]])["collectors"].split(",")
    assert {"prometheus", "alertmanager", "grafana", "trainer"} <= set(started)
    # and so do the gpu profiles, with the GPU agent instead
    started_gpu = [n for n, s in raw["services"].items() if not s.get("profiles") or "gpu" in s["profiles"]]
    assert [n for n in started_gpu if n in _agents(services)] == gpu


# deploy/ files of the other engines (Kubernetes, systemd/Slurm) and the remote_write example:
# not part of the compose stack
OTHER_ENGINES = ("deploy/kubernetes/", "deploy/systemd/", "deploy/slurm/", "deploy/prometheus-remote-write.yml")


def _deploy_files() -> Set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(DEPLOY):
        for f in filenames:
            rel = str((Path(dirpath) / f).relative_to(ROOT))
            if not rel.startswith(OTHER_ENGINES):
                out.add(rel)
    return out


def test_compose_mounts_exactly_the_files_deploy_holds(services):
    mounted = set()
    for svc in services.values():
        for src, _, _ in _binds(svc):
            p = Path(src)
            if p.is_relative_to(DEPLOY):
                mounted.add(str(p.relative_to(ROOT)))
    files = _deploy_files()
    assert mounted == files, f"deploy/ holds {sorted(files - mounted)} unmounted; mounts {sorted(mounted - files)} missing"
    for f in files:  # the links into alerts/ resolve (a directory mount would break them: mount files)
        assert (ROOT / f).resolve().is_file(), f"{f} is a dangling link"
        assert not (ROOT / f).is_dir()


def test_deploy_links_point_at_the_generated_alert_files():
    assert (DEPLOY / "rules" / "ranksight-rules.yml").resolve() == (ROOT / "alerts" / "ranksight-rules.yml").resolve()
    assert (DEPLOY / "alertmanager.yml").resolve() == (ROOT / "alerts" / "alertmanager.yml").resolve()
    assert os.readlink(DEPLOY / "rules" / "ranksight-rules.yml") == "../../alerts/ranksight-rules.yml"
    assert os.readlink(DEPLOY / "alertmanager.yml") == "../alerts/alertmanager.yml"
    # alertmanager.yml names its template relative to itself: templates/ranksight.tmpl beside it
    assert os.readlink(DEPLOY / "templates" / "ranksight.tmpl") == "../../alerts/templates/ranksight.tmpl"


def _target(svc: dict, host_path: Path) -> str:
    for src, target, _ in _binds(svc):
        if Path(src) == host_path:
            return target
    raise AssertionError(f"{host_path} is not mounted")


def test_prometheus_config_matches_the_services(services):
    prom = services["prometheus"]
    cfg = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    assert _target(prom, DEPLOY / "prometheus.yml") == "/etc/prometheus/prometheus.yml"
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom["command"]
    rules_target = _target(prom, DEPLOY / "rules" / "ranksight-rules.yml")
    assert any(Path(rules_target).match(g) for g in cfg["rule_files"]), (rules_target, cfg["rule_files"])
    # Alertmanager by service name and port
    am = [t for a in cfg["alerting"]["alertmanagers"] for s in a["static_configs"] for t in s["targets"]]
    assert am == ["alertmanager:9093"] and "alertmanager" in services
    assert _target(services["alertmanager"], DEPLOY / "alertmanager.yml") in " ".join(services["alertmanager"]["command"])
    # the agents on the host network, reached through the host gateway
    job = next(j for j in cfg["scrape_configs"] if j["job_name"] == triage.SCRAPE_JOB)
    assert job.get("honor_labels") is True
    targets = [t for s in job["static_configs"] for t in s["targets"]]
    ports = {_flags(a)["listen"].rsplit(":", 1)[1] for a in _agents(services).values()}
    for t in targets:
        host, port = t.rsplit(":", 1)
        assert port in ports, t
        if host == "host.docker.internal":
            assert "host.docker.internal:host-gateway" in prom.get("extra_hosts", [])


def test_grafana_provisioning_loads_the_dashboards(services):
    g = services["grafana"]
    prov = DEPLOY / "grafana" / "provisioning"
    ds = yaml.safe_load((prov / "datasources" / "prometheus.yml").read_text())
    prom_ds = [d for d in ds["datasources"] if d["type"] == "prometheus"]
    assert len(prom_ds) == 1 and prom_ds[0]["uid"] == "prometheus" and prom_ds[0]["isDefault"]
    assert prom_ds[0]["url"] == "http://prometheus:9090"
    scrape = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())["global"]["scrape_interval"]
    assert prom_ds[0]["jsonData"]["timeInterval"] == scrape, "Grafana's $__rate_interval needs the scrape interval"
    assert _target(g, prov / "datasources" / "prometheus.yml").startswith("/etc/grafana/provisioning/datasources/")
    assert _target(g, prov / "dashboards" / "ranksight.yml").startswith("/etc/grafana/provisioning/dashboards/")
    provider = yaml.safe_load((prov / "dashboards" / "ranksight.yml").read_text())["providers"]
    assert len(provider) == 1 and provider[0]["type"] == "file"
    path = provider[0]["options"]["path"]
    assert _target(g, ROOT / "dashboards") == path
    for name in generate.FILES:
        assert (ROOT / "dashboards" / name).is_file()
    home = g["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{path}/ranksight-triage.json"


def test_agent_image_has_no_torch_and_runs_the_exporter():
    text = (ROOT / "Dockerfile").read_text()
    instructions = [ln for ln in text.splitlines() if ln and not ln.lstrip().startswith("#")]
    body = "\n".join(instructions)
    assert re.search(r"^FROM python:3\.\d+-slim", body, re.M)
    assert "pip install --no-cache-dir ." in body
    assert "torch" not in body.replace('"import torch"', "")  # only the check that it is absent
    assert 'ENTRYPOINT ["ranksight", "exporter"]' in body
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignore and ".git" in ignore


def test_trainer_runs_the_instrumented_example_on_two_ranks(services):
    t = services["trainer"]
    assert t["build"]["dockerfile"] == "Dockerfile.trainer"
    assert (ROOT / "Dockerfile.trainer").is_file()
    cmd = t["command"]
    assert cmd[0] == "torchrun" and "--nproc-per-node" in cmd and cmd[cmd.index("--nproc-per-node") + 1] == "2"
    script = ROOT / next(c for c in cmd if c.endswith(".py"))
    src = script.read_text()
    assert re.search(r"^import ranksight\b", src, re.M) and "ranksight.watch(" in src
    assert "gloo" in src
    assert "download.pytorch.org/whl/cpu" in (ROOT / "Dockerfile.trainer").read_text()
    # the trainer shares the agent's network namespace: its datagrams reach 127.0.0.1:9946
    assert t.get("network_mode") == "host"
    assert t["environment"]["RANKSIGHT_AGENT"] in {_flags(a)["ingest"] for a in _agents(services).values()}
