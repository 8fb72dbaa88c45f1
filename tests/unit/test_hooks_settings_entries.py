"""The hooks' config (hooks/settings.py): a bad entry costs only itself. An unknown key, a bad
value, an unknown section, a malformed variable name or an unreadable file is one warning line
naming it and what is wrong; every other setting still applies; nothing raises."""
from __future__ import annotations

import logging

import pytest

from ranksight import config as rs_config
from ranksight.hooks import settings as S

LOG = "ranksight.hooks"


def warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOG and r.levelno == logging.WARNING]


def hooks(config=None, env=None, **kw):
    return S.sections(config, ("hooks",), env=env or {}, **kw)["hooks"]


def test_a_misspelled_key_costs_only_itself(caplog):
    caplog.set_level(logging.DEBUG, logger=LOG)
    got = hooks(env={"RANKSIGHT__hooks__heartbeat_secs": "2", "RANKSIGHT__hooks__table_every_steps": "7",
                     "RANKSIGHT__hooks__heartbeat_seconds": "0.5"})
    assert got["heartbeat_seconds"] == 0.5 and got["table_every_steps"] == 7
    assert warnings(caplog) == ["ranksight: env RANKSIGHT__hooks__heartbeat_secs: unknown key hooks.heartbeat_secs "
                                "(did you mean heartbeat_seconds?); ignored, the other settings apply"]


def test_a_bad_value_keeps_what_the_earlier_layers_gave(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=LOG)
    f = tmp_path / "c.yml"
    f.write_text("hooks:\n  heartbeat_seconds: 0.5\n  max_pending_events: 3\n  log_dir: /var/log/run\n")
    got = hooks(str(f), env={"RANKSIGHT__hooks__heartbeat_seconds": "fast", "RANKSIGHT__hooks__table_every_steps": "0"})
    assert (got["heartbeat_seconds"], got["max_pending_events"], got["log_dir"], got["table_every_steps"]) == \
        (0.5, 256, "/var/log/run", 0)
    assert warnings(caplog) == [
        f"ranksight: config {f}: hooks.max_pending_events: 3 is outside [8, 1e+06]; using the default 256",
        "ranksight: env RANKSIGHT__hooks__heartbeat_seconds: expected a number, got 'fast'; keeping 0.5"]


def test_the_environment_names_the_file_on_the_command_line(tmp_path, monkeypatch):
    f = tmp_path / "c.yml"
    f.write_text("hooks:\n  table_every_steps: 5\n")
    assert hooks(env={"RANKSIGHT_CONFIG": str(f)})["table_every_steps"] == 5
    assert hooks(str(f), env={"RANKSIGHT__hooks__table_every_steps": "9"})["table_every_steps"] == 9  # env wins
    monkeypatch.setenv("RANKSIGHT__hooks__table_every_steps", "11")
    assert S.sections(None, ("hooks",))["hooks"]["table_every_steps"] == 11  # os.environ by default


@pytest.mark.parametrize("text, why", [
    ("hooks: [unclosed\n", "invalid YAML at line 2; its settings are ignored"),
    ("- a list\n", "expected a mapping of sections, got list; ignored, the other settings apply"),
    ("hooks: 3\n", "section 'hooks' must be a mapping; ignored, the other settings apply"),
])
def test_a_broken_file_costs_its_own_entries(tmp_path, caplog, text, why):
    caplog.set_level(logging.WARNING, logger=LOG)
    f = tmp_path / "c.yml"
    f.write_text(text)
    got = hooks(str(f), env={"RANKSIGHT__hooks__heartbeat_seconds": "0.3"})
    assert got["heartbeat_seconds"] == 0.3
    assert warnings(caplog) == [f"ranksight: config {f}: {why}"]


def test_a_missing_file_is_one_line(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=LOG)
    missing = tmp_path / "nope.yml"
    assert hooks(str(missing), env={"RANKSIGHT__hooks__heartbeat_seconds": "0.3"})["heartbeat_seconds"] == 0.3
    assert warnings(caplog) == [f"ranksight: config {missing}: cannot read: No such file or directory; "
                                "its settings are ignored"]


def test_unknown_sections_and_malformed_names_are_one_line_each(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=LOG)
    f = tmp_path / "c.yml"
    f.write_text("hook:\n  a: 1\n  b: 2\nagent:\n  listen: nonsense-but-not-ours\n  typo: 1\n")
    got = hooks(str(f), env={"RANKSIGHT__hooks_heartbeat_seconds": "2", "RANKSIGHT__hooks__log_dir": "/l"})
    assert got["log_dir"] == "/l" and got["heartbeat_seconds"] == 1.0
    known = ", ".join(rs_config.SCHEMA)
    assert sorted(warnings(caplog)) == sorted([
        f"ranksight: config {f}: unknown section 'hook' (known: {known}); ignored, the other settings apply",
        "ranksight: env RANKSIGHT__hooks_heartbeat_seconds: expected RANKSIGHT__<section>__<key>; "
        "ignored, the other settings apply"])  # the agent section is the agent's to judge


def test_a_second_reader_reports_its_own_sections_only(caplog):
    """The lints read lints and two thresholds after the watcher read hooks: a problem with the
    whole config is the watcher's line (a debug line here); their own keys are theirs."""
    caplog.set_level(logging.DEBUG, logger=LOG)
    env = {"RANKSIGHT__lints__sampler_epok": "0", "RANKSIGHT__lints__numa_binding": "0",
           "RANKSIGHT__hooks__heartbeat_secs": "1", "RANKSIGHT__hook__x": "1",
           "RANKSIGHT__thresholds__lint_min_free_bytes": "-1", "RANKSIGHT__thresholds__comm_share": "7"}
    got = S.sections(None, ("lints", "thresholds"), who="lints", quiet_load=True, env=env,
                     keys={"thresholds": ("lint_min_free_bytes",)})
    assert got["lints"]["numa_binding"] is False and got["thresholds"] == {"lint_min_free_bytes": 10e9}
    assert warnings(caplog) == [
        "ranksight: env RANKSIGHT__lints__sampler_epok: unknown key lints.sampler_epok (did you mean sampler_epoch?); "
        "ignored, the other settings apply",
        "ranksight: env RANKSIGHT__thresholds__lint_min_free_bytes: '-1' is outside [0, 1e+15]; "
        "using the default 10000000000.0"]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and "'hook'" in r.getMessage()]


def test_a_dict_config_reports_unknown_keys_too(caplog):
    caplog.set_level(logging.WARNING, logger=LOG)
    got = hooks({"hooks": {"heartbeat_sec": 0.1, "table_every_steps": 3}, "lints": None}, env={
        "RANKSIGHT__hooks__table_every_steps": "99"})  # a dict stands alone: no file, no environment
    assert got["table_every_steps"] == 3 and got["heartbeat_seconds"] == 1.0
    assert warnings(caplog) == ["ranksight: config: unknown key hooks.heartbeat_sec (did you mean heartbeat_seconds?); "
                                "ignored, the other settings apply"]


def test_nothing_raises_into_the_caller(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger=LOG)

    def broken(section, key, value):
        raise RuntimeError("validator bug")

    monkeypatch.setattr(S.rs_config, "validate", broken)
    got = hooks(env={"RANKSIGHT__hooks__table_every_steps": "7"})
    assert got == rs_config.defaults()["hooks"]
    assert warnings(caplog) == ["ranksight: cannot load the config (RuntimeError: validator bug); "
                                "the hooks use the built-in defaults"]


def test_load_settings_applies_the_rest(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger=LOG)
    monkeypatch.setenv("RANKSIGHT__hooks__heartbeat_secs", "2")
    monkeypatch.setenv("RANKSIGHT__hooks__stack_after_seconds", "0")
    monkeypatch.setenv("RANKSIGHT__hooks__agent", "unix:///run/agent.sock")
    monkeypatch.delenv("RANKSIGHT_AGENT", raising=False)
    s = S.load_settings()
    assert s.stack_after_seconds == 0 and str(s.agent) == "unix:///run/agent.sock" and s.heartbeat_seconds == 1.0
    assert len(warnings(caplog)) == 1 and "heartbeat_secs" in warnings(caplog)[0]


def test_watch_with_a_typo_applies_the_rest_and_says_each_problem_once(monkeypatch, caplog):
    torch = pytest.importorskip("torch")
    import ranksight

    caplog.set_level(logging.WARNING, logger=LOG)
    for k, v in {"RANKSIGHT__hooks__heartbeat_secs": "2", "RANKSIGHT__hooks__heartbeat_seconds": "0.2",
                 "RANKSIGHT__lints__sampler_epok": "0", "RANKSIGHT__hooks__table_every_steps": "0",
                 "RANKSIGHT__hooks__table_every_seconds": "0"}.items():
        monkeypatch.setenv(k, v)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = ranksight.watch(model, opt, [torch.randn(3, 4) for _ in range(3)], agent="off")
    try:
        w = ranksight.hooks.current()
        assert w.settings.heartbeat_seconds == 0.2 and w.settings.table_every_steps == 0
        for x in loader:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    finally:
        ranksight.unwatch()
    lines = warnings(caplog)
    assert sum("heartbeat_secs" in m for m in lines) == 1 and sum("sampler_epok" in m for m in lines) == 1, lines
