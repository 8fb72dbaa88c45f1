"""Shared fixtures: real processes on free loopback ports, cleaned up after each test.

``agent`` -> factory ``agent(collectors="network,disk,ranks", env=None, args=(), name="agent") -> AgentProcess``
    Starts a real ``ranksight exporter`` subprocess (``python -m ranksight exporter``) on a free
    HTTP port and a free UDP ingest port and waits until /metrics answers. Use ``a.target``
    ("127.0.0.1:PORT") as a scrape target, ``a.ingest`` ("udp://127.0.0.1:PORT") as the hooks'
    ``RANKSIGHT_AGENT``, ``a.metrics_text()``, ``a.pid``, ``a.log_file``. Extra config goes through
    ``env`` (``{"RANKSIGHT__agent__stall_min_seconds": "5"}``). The default collectors are those that
    run on a CPU machine; pass ``collectors=None`` for the config default (all). Stopped at teardown.

``local_stack`` -> factory ``local_stack(targets=(), files=None, cfg=None, profile="test",
                                         scrape_interval="1s", **kw) -> LocalStack``
    Starts Debian's Prometheus and Alertmanager on free ports with the given scrape targets and
    waits until both are ready. Rules and alertmanager.yml: ``files`` (names -> text, like
    ``ranksight.alerts.generate.render(cfg)``; top-level ``*.yml`` other than alertmanager.yml are
    rule files), else rendered from ``cfg`` (default: the ``profile`` config, "test"). Scrape and
    rule evaluation run every ``scrape_interval``. Use ``s.prom`` (``PrometheusAPI``: ``query``,
    ``value``, ``rules``, ``rule_names``, ``alerts``, ``targets``) and ``s.am`` (``AlertmanagerAPI``:
    ``alerts`` with ``status.inhibitedBy``, ``inhibited_names``), ``s.prom_url``, ``s.am_url``,
    ``s.run_dir``. Stopped at teardown. A missing binary FAILS the test with the apt-get line
    (nothing is skipped silently).

``require_binary(name)`` -> path, or pytest.fail naming the Debian package.

``private_network()`` -> argv prefix (``unshare --net ...``) that runs a command in a new network
    namespace whose loopback is up, so commands that use the fixed default ports (9090, 9093, 9945,
    9946) as the README and ``ranksight demo --keep`` do cannot clash with anything else running;
    or pytest.fail saying why it cannot (it needs root or unprivileged user namespaces).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator, List, Mapping, Optional, Sequence

import pytest

from ranksight import config
from ranksight.common.servers import MissingBinary, ServerError, find_binary
from ranksight.tools.stack import AgentProcess, LocalStack

CPU_COLLECTORS = "network,disk,ranks"


@pytest.fixture
def clean_watch_env(monkeypatch):
    """No RANKSIGHT_* or launcher variables from the calling shell; the watch ends with the test."""
    import os

    for k in list(os.environ):
        if k.startswith("RANKSIGHT") or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(k, raising=False)
    yield
    import ranksight

    ranksight.unwatch()


def require_binary(name: str) -> str:
    try:
        return find_binary(name)
    except MissingBinary as e:
        pytest.fail(str(e), pytrace=False)


def private_network() -> List[str]:
    import os
    import shutil
    import subprocess

    if shutil.which("unshare") is None:
        pytest.fail("unshare not found: install util-linux", pytrace=False)
    argv = ["unshare", "--net"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    probe = subprocess.run(argv + ["ip", "link", "set", "lo", "up"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.fail(f"cannot make a private network namespace ({' '.join(argv)}): {probe.stderr.strip()}",
                    pytrace=False)
    return argv + ["sh", "-c", 'ip link set lo up && exec "$@"', "sh"]


@pytest.fixture
def rx():
    """A datagram receiver on loopback for an in-process watch; at the end the watch is ended and
    every datagram the hooks sent must have passed protocol.decode."""
    import ranksight
    from hooks_workloads.harness import Receiver

    r = Receiver()
    yield r
    ranksight.unwatch()
    r.close()
    assert not r.invalid, f"hooks sent datagrams that fail validation: {r.invalid[:3]}"


@pytest.fixture
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., AgentProcess]]:
    started: List[AgentProcess] = []

    def make(collectors: Optional[str] = CPU_COLLECTORS, env: Optional[Mapping[str, str]] = None,
             args: Sequence[str] = (), name: str = "agent", timeout: float = 20.0) -> AgentProcess:
        a = AgentProcess(tmp_path_factory.mktemp(name), collectors=collectors, env=env, args=args, name=name)
        started.append(a)
        try:
            return a.start(timeout=timeout)
        except ServerError as e:
            error = str(e)
        pytest.fail(f"agent did not start: {error}", pytrace=False)

    yield make
    for a in reversed(started):
        a.stop()


@pytest.fixture
def local_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., LocalStack]]:
    started: List[LocalStack] = []

    def make(targets: Sequence[str] = (), files: Optional[Mapping[str, str]] = None,
             cfg: Optional[Mapping] = None, profile: str = "test", scrape_interval: str = "1s",
             timeout: float = 30.0, **kw) -> LocalStack:
        require_binary("prometheus")
        require_binary("alertmanager")
        if cfg is None and (files is None or "alertmanager.yml" not in files):
            cfg = config.load(None, profile, env={})
        s = LocalStack(Path(tmp_path_factory.mktemp("stack")), targets=list(targets), cfg=cfg, files=files,
                       scrape_interval=scrape_interval, **kw)
        started.append(s)
        try:
            return s.start(timeout=timeout)
        except ServerError as e:
            error = str(e)
        pytest.fail(f"local stack did not start: {error}", pytrace=False)

    yield make
    for s in reversed(started):
        s.stop()


# ------------------------------------------------------------------ the fast subset
# tests/integration/ holds the suites that run real multi-process work (gloo DDP jobs, the
# frameworks, a live Prometheus and Alertmanager, promtool over every rule, Slurm); tests/e2e/ is
# the end-to-end fault suite. Every test under either is `slow`, so `pytest -m "not slow"` (the
# tests under tests/unit/) is the inner loop.
SLOW_DIRS = ("integration", "e2e")


def pytest_collection_modifyitems(config, items):  # noqa: ARG001 - pytest's hook signature
    slow = [Path(__file__).resolve().parent / d for d in SLOW_DIRS]
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if any(path.is_relative_to(d) for d in slow):
            item.add_marker(pytest.mark.slow)

