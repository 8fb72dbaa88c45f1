"""Core: catalog, protocol, config, triage table, CLI. Torch-free."""
import json
import subprocess
import sys

import pytest

from ranksight import catalog, config, protocol, triage


def test_catalog_names_follow_contract():
    for m in catalog.CATALOG.values():
        assert m.name.startswith("ranksight_")
        if m.type == "counter":
            assert m.name.endswith("_total")
        if m.type == "histogram":
            assert m.buckets and list(m.buckets) == sorted(m.buckets)


def test_core_does_not_import_torch():
    code = "import sys, ranksight, ranksight.cli, ranksight.triage, ranksight.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _rec(**kw):
    base = {"v": 1, "t": "step", "job": "j", "rank": 0, "lr": 0, "ws": 2, "node": "n", "pid": 1, "ts": 1.0e9,
            "seq": 1, "dur": 0.1, "data": 0.01}
    base.update(kw)
    return protocol.encode(base)


def test_protocol_roundtrip_and_rejects():
    r = protocol.decode(_rec())
    assert r["dur"] == 0.1 and r["micro"] == 1
    for bad, result in [
        (b"not json", "malformed"),
        (b"[1,2]", "malformed"),
        (_rec(v=3), "rejected"),  # a version this agent does not know
        (_rec(v=0), "rejected"),
        (_rec(rank=2), "rejected"),
        (_rec(dur=-1), "rejected"),
        (json.dumps({"v": 1, "t": "step", "job": "j", "rank": 0, "lr": 0, "ws": 1, "node": "n", "pid": 1,
                     "ts": 1.0, "seq": 1, "dur": float("nan")}).encode(), "rejected"),
        (b"{" + b" " * protocol.MAX_DATAGRAM + b"}", "oversize"),
        (_rec(job="x" * 500), "rejected"),
        (_rec(t="nope"), "rejected"),
    ]:
        with pytest.raises(protocol.ProtocolError) as e:
            protocol.decode(bad)
        assert e.value.result == result, bad[:60]


def test_config_validation_one_line(tmp_path):
    p = tmp_path / "c.yml"
    p.write_text("thresholds:\n  comm_share: 3\n")
    with pytest.raises(config.ConfigError) as e:
        config.load(str(p), env={})
    assert "thresholds.comm_share" in str(e.value) and "\n" not in str(e.value)
    p.write_text("thresholds: {comm_share: 0.4}\n")
    assert config.load(str(p), env={})["thresholds"]["comm_share"] == 0.4
    assert config.load(env={"RANKSIGHT__thresholds__comm_share": "0.5"})["thresholds"]["comm_share"] == 0.5
    with pytest.raises(config.ConfigError):
        config.load(env={"RANKSIGHT__durations__comm_bound": "ten minutes"})
    with pytest.raises(config.ConfigError):
        config.load(env={"RANKSIGHT__nosuch__x": "1"})


def test_test_profile_only_changes_durations_and_windows():
    d, t = config.load(env={}), config.load(profile="test", env={})
    for section in d:
        if section not in ("durations", "windows"):
            assert d[section] == t[section]


def test_triage_table_order_and_uniqueness():
    cfg = config.load(env={})
    entries = triage.table(cfg)
    assert len({e.alert for e in entries}) == len(entries)
    assert len({e.id for e in entries}) == len(entries)
    assert [e.order for e in triage.signals(cfg)] == sorted(e.order for e in triage.signals(cfg))
    assert {e.order for e in triage.signals(cfg)} == {1, 2, 3, 4, 5, 6}
    names = {e.alert for e in entries}
    for e in entries:
        assert e.alert.startswith("Ranksight")
        for inh in e.inhibits:
            assert set(inh.targets) <= names, (e.alert, inh.targets)


def test_cli_bad_usage_exit_2():
    out = subprocess.run([sys.executable, "-m", "ranksight", "--bogus"], capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    out = subprocess.run([sys.executable, "-m", "ranksight", "config"], capture_output=True, text=True,
                         env={"RANKSIGHT__thresholds__comm_share": "abc", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "comm_share" in out.stderr
