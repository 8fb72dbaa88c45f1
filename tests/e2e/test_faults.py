"""The end-to-end fault suite: each incident injected for real into a 2-rank gloo
DDP job, watched by the real agent, a real Prometheus and Alertmanager with the
test-profile rules; the expected alert must fire within 60 s on the right rank or host,
its symptoms must show as inhibited in Alertmanager, and `ranksight triage` must name
the cause (exit 1). A healthy run on two hosts must stay quiet and be called healthy
(exit 0), and every dashboard query must return data from it (GPU and RDMA panels
excepted on this CPU machine, and named).

Run: ``.venv/bin/python -m pytest -q -m e2e tests/e2e`` (root: network namespaces).
"""
from __future__ import annotations

import json
import re
import time
from typing import Any, Dict, Iterator, List

import pytest

from e2e_netns import available
from e2e_harness import DETECT_EXTRA_S
from e2e_suite import CASES, GROUPS, HOST_B, Observation, Suite

pytestmark = [pytest.mark.e2e]


@pytest.fixture(scope="session")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Suite]:
    why = available()
    if why:
        pytest.fail(f"the end-to-end suite {why} (network namespaces, veths, iptables)", pytrace=False)
    s = Suite(tmp_path_factory.mktemp("e2e"))
    try:
        s.start()
        yield s
    finally:
        s.close()
        print(f"\ne2e suite: {time.monotonic() - s.t0:.0f} s wall (logs, triage reports: {s.dir})")
        for n, o in s.results.items():
            c = (o.triage or {}).get("cause") or {}
            print(f"  {n:16} {o.seconds:5.1f} s  first step {o.first_step_s:5.1f} s  detect {o.detect_s:5.1f} s  "
                  f"triage exit {o.triage_rc} {c.get('alert', '-')} {c.get('labels', {}).get('rank', c.get('labels', {}).get('node', ''))} "
                  f"value {c.get('value')}{'  ERROR ' + o.error.splitlines()[0] if o.error else ''}")
            if o.timeline:
                print("      alerts: " + ", ".join(o.timeline))


ORDER = [n for g in GROUPS for n in g]
# two-host cases also carry the netns marker (root, ip netns, iptables)
FAULTS = [pytest.param(n, marks=[pytest.mark.netns] if CASES[n].two_hosts else []) for n in ORDER
          if not CASES[n].healthy]



def _name(a: Dict[str, Any]) -> str:
    return a["labels"]["alertname"]


def _show(alerts: List[Dict[str, Any]]) -> str:
    return "; ".join(f"{_name(a)}{{rank={a['labels'].get('rank', '')},node={a['labels'].get('node', '')}}}"
                     f"{' inhibited' if a['status']['inhibitedBy'] else ''}" for a in alerts)


def _check_ok(obs: Observation) -> None:
    assert not obs.error, obs.explain()


@pytest.mark.parametrize("name", FAULTS)
def test_fault_fires_in_time_on_the_right_rank(suite: Suite, name: str) -> None:
    """The cause is active in Alertmanager within the case's bound (60 s; 50 s for the straggler
    matrix and comm-wide; plus DETECT_EXTRA_S on the VictoriaMetrics layout) on the right rank or host."""
    case, obs = CASES[name], suite.observe(name)
    _check_ok(obs)
    assert obs.detect_s <= case.detect_limit + DETECT_EXTRA_S, obs.explain()
    assert obs.cause_alerts, obs.explain()
    for a in obs.cause_alerts:
        assert a["labels"]["job"] == obs.job
        assert all(a["labels"].get(k) == v for k, v in case.where.items()), _show(obs.cause_alerts)
        assert not a["status"]["inhibitedBy"], "the cause itself must not be muted"
    if name == "packet-loss":  # the host whose packets are lost retransmits; the other does not alert
        assert not [a for a in obs.job_alerts if _name(a) == case.cause and a["labels"].get("node") == HOST_B], \
            _show(obs.job_alerts)


@pytest.mark.parametrize("name", FAULTS)
def test_fault_symptoms_are_inhibited(suite: Suite, name: str) -> None:
    case, obs = CASES[name], suite.observe(name)
    _check_ok(obs)
    for key, alerts in obs.symptoms.items():
        assert alerts, f"{key} never fired for {obs.job}; alerts: {_show(obs.job_alerts)}"
        loud = [a for a in alerts if not a["status"]["inhibitedBy"]]
        assert not loud, f"{key} fired but is not inhibited: {_show(loud)}"
    # and nothing else about the job is left loud: every other alert is muted by a cause
    causes = {case.cause} | {alert for alert, _ in case.also}
    loud = [a for a in obs.job_alerts if _name(a) not in causes and not a["status"]["inhibitedBy"]]
    assert not loud, f"alerts of {obs.job} neither the cause nor inhibited: {_show(loud)}"


@pytest.mark.parametrize("name", FAULTS)
def test_triage_names_the_cause(suite: Suite, name: str) -> None:
    case, obs = CASES[name], suite.observe(name)
    _check_ok(obs)
    assert obs.triage_rc == 1, obs.explain()
    cause = obs.triage["cause"]
    assert cause["alert"] == case.cause, obs.triage_text
    assert cause["labels"].get("job") == obs.job, obs.triage_text
    for k, v in case.where.items():
        assert cause["labels"].get(k) == v, obs.triage_text
    assert cause["runbook"].startswith("http") and cause["next_check"]
    assert f"cause: {case.cause}" in obs.triage_text and "runbook:" in obs.triage_text
    # the symptoms are reported as explained by the cause, not as causes
    causes = {c["alert"] for c in obs.triage["causes"]}
    for alert, _ in case.symptoms:
        assert alert not in causes or alert == case.cause, obs.triage_text
        check = next(c for c in obs.triage["checks"] if c["alert"] == alert)
        assert check["findings"], f"triage saw no {alert}: {obs.triage_text}"
        assert all(f["explained_by"] for f in check["findings"]), obs.triage_text


def test_hang_page_names_the_place(suite: Suite) -> None:
    """The hung rank's page says where it is stuck: the training script's line and the call on it."""
    obs = suite.observe("hang")
    _check_ok(obs)
    desc = obs.cause_alerts[0]["annotations"]["description"]
    assert re.search(r"stalled \d+ s at train_ddp\.py:\d+ in main <- time\.sleep\.$", desc), desc
    # triage prints the chain: the culprit's place, then what its peer waits in
    places = obs.triage["places"]
    assert len(places) == 2 and re.match(r"rank 1 stuck at train_ddp\.py:\d+ in main <- time\.sleep for \d+ s$",
                                         places[0]), places
    assert re.match(r"rank 0 waits in all_?reduce #\d+ on the default_pg group for \d+ s", places[1]), places
    assert "  where:    rank 1 stuck at train_ddp.py:" in obs.triage_text, obs.triage_text


def test_desync_page_gives_each_ranks_position(suite: Suite) -> None:
    obs = suite.observe("desync")
    _check_ok(obs)
    desc = obs.cause_alerts[0]["annotations"]["description"]
    assert re.search(r"rank 0 in all_reduce #(\d+), rank 1 in broadcast #\1\.$", desc), desc
    places = obs.triage["places"]
    assert [re.sub(r"#\d+|\d+ s", "N", p).split(" (at ")[0] for p in places] == [
        "rank 0 waits in all_reduce N on the default_pg group for N", "rank 1 waits in broadcast N on the default_pg group for N"
    ], places


def test_comm_bound_job_is_never_paged_as_a_straggler(suite: Suite) -> None:
    """Comm over half of the step on both ranks: CommBound names it on both ranks, unmuted, as the
    job's own cost (comm="own"), and no Straggler shows at any time of the watch (the timeline holds
    every alert Alertmanager showed)."""
    obs = suite.observe("comm-wide")
    _check_ok(obs)
    comm = [a for a in obs.job_alerts if _name(a) == "RanksightCommBound"]
    assert {a["labels"].get("rank") for a in comm} == {"0", "1"}, _show(obs.job_alerts)
    assert {a["labels"].get("comm") for a in comm} == {"own"}, _show(comm)
    assert not [a for a in comm if a["status"]["inhibitedBy"]], _show(comm)
    assert not [t for t in obs.timeline if "RanksightStraggler" in t], obs.explain()


def test_straggler_on_a_comm_heavy_model_pages_both(suite: Suite) -> None:
    """A straggler on a comm-heavy model: the straggler is named on its rank, and the job's own comm
    cost still pages (comm="own", not muted by the straggler)."""
    obs = suite.observe("straggler-comm")
    _check_ok(obs)
    comm = [a for a in obs.job_alerts if _name(a) == "RanksightCommBound" and not a["status"]["inhibitedBy"]]
    assert comm and {a["labels"].get("comm") for a in comm} == {"own"}, _show(obs.job_alerts)
    strag = [a for a in obs.job_alerts if _name(a) == "RanksightStraggler"]
    assert [a["labels"]["rank"] for a in strag] == ["1"], _show(obs.job_alerts)


HELD = [n for n in ORDER if CASES[n].hold and not CASES[n].healthy]


@pytest.mark.parametrize("name", HELD)
def test_cause_stays_active_while_the_fault_goes_on(suite: Suite, name: str) -> None:
    """Once named, the cause stays active in Alertmanager for as long as the case is watched (the
    symptoms' wait and the hold): a rule sitting on its threshold would come and go."""
    obs = suite.observe(name)
    _check_ok(obs)
    assert not obs.cause_gaps, f"{CASES[name].cause} not active at {obs.cause_gaps} s; {obs.explain()}"


@pytest.mark.parametrize("name", [n for n in ORDER if n.startswith("straggler")])
def test_straggler_page_says_why(suite: Suite, name: str) -> None:
    """The straggler's page gives its busy time against its peers' median and how long they wait for it."""
    obs = suite.observe(name)
    _check_ok(obs)
    strag = [a for a in obs.job_alerts if _name(a) == "RanksightStraggler"]
    assert strag, obs.explain()
    desc = strag[0]["annotations"]["description"]
    assert re.search(r"is \d+\.\d\dx its peers' median: [\d.]+m?s a step against [\d.]+m?s, so each of its "
                     r"peers waits about [\d.]+m?s a step for it", desc), desc


COMPOUND = [n for n in ORDER if CASES[n].also]


@pytest.mark.parametrize("name", COMPOUND)
def test_compound_fault_names_every_cause(suite: Suite, name: str) -> None:
    """Two independent causes at once: Alertmanager holds both active, and triage names both."""
    case, obs = CASES[name], suite.observe(name)
    _check_ok(obs)
    named = [(c["alert"], c["labels"]) for c in obs.triage["causes"]]
    for alert, where in case.also:
        got = obs.also[f"{alert} {json.dumps(dict(where), sort_keys=True)}"]
        assert got and not any(a["status"]["inhibitedBy"] for a in got), f"{alert}: {_show(got)}; {obs.explain()}"
        assert any(n == alert and where.items() <= labels.items() for n, labels in named), obs.triage_text


SOLE = [n for n in ORDER if CASES[n].sole]


@pytest.mark.parametrize("name", SOLE)
def test_side_effects_of_one_cause_never_page(suite: Suite, name: str) -> None:
    """One cause whose side effect moves another signal (a long checkpoint write keeps the peer
    blocked in its all-reduce): triage names that cause alone, the side effect shows only as
    explained, and Alertmanager never held any other alert of the job active while it was watched."""
    case, obs = CASES[name], suite.observe(name)
    _check_ok(obs)
    causes = {(c["alert"], c["labels"].get("rank", "")) for c in obs.triage["causes"]}
    assert causes == {(case.cause, case.where.get("rank", ""))}, obs.triage_text
    loud = [t for t in obs.timeline if not t.endswith(" inhibited") and f" {case.cause}[" not in t]
    assert not loud, obs.explain()
    for alert, where in case.symptoms:  # the side effect did happen: it fired, and only muted
        assert any(f" {alert}[{where.get('rank', '')}] inhibited" in t for t in obs.timeline), obs.explain()


def _place(labels: Dict[str, str]) -> Dict[str, str]:
    return {k: labels[k] for k in ("rank", "node", "pg") if labels.get(k)}


@pytest.mark.parametrize("name", FAULTS)
def test_triage_says_what_alertmanager_pages(suite: Suite, name: str) -> None:
    """What `ranksight triage` names is what Alertmanager pages: the cause it names (with its rank or
    node) is an alert Alertmanager holds active, every alert Alertmanager holds active is a cause
    triage names, and the symptoms triage reports as explained are exactly the alerts Alertmanager
    inhibits (by name)."""
    obs = suite.observe(name)
    _check_ok(obs)
    loud = [a for a in obs.job_alerts if not a["status"]["inhibitedBy"]]
    muted = {_name(a) for a in obs.job_alerts if a["status"]["inhibitedBy"]}
    cause = obs.triage["cause"]
    assert any(_name(a) == cause["alert"] and _place(a["labels"]).items() <= cause["labels"].items()
               for a in loud), f"triage names {cause['alert']} {_place(cause['labels'])}; Alertmanager pages {_show(loud)}"
    named = {c["alert"] for c in obs.triage["causes"]}
    assert {_name(a) for a in loud} <= named, (_show(loud), sorted(named))
    explained = {c["alert"] for c in obs.triage["checks"] if any(f["explained_by"] for f in c["findings"])}
    assert muted == explained & (muted | {_name(a) for a in obs.job_alerts}), \
        f"Alertmanager inhibits {sorted(muted)}; triage explains {sorted(explained)}"


@pytest.mark.netns
def test_healthy_run_stays_quiet_and_triage_says_healthy(suite: Suite) -> None:
    obs = suite.observe("healthy")
    _check_ok(obs)
    fired = list(obs.fired)
    assert not fired, f"alerts fired during the healthy run: {fired}"
    assert not obs.job_alerts, _show(obs.job_alerts)
    assert obs.triage_rc == 0, obs.explain()
    assert obs.triage["healthy"] and obs.triage["cause"] is None
    assert "verdict: healthy" in obs.triage_text
    verdicts = {c["alert"]: c["verdict"] for c in obs.triage["checks"]}
    for alert in ("RanksightDataloaderBound", "RanksightCommBound", "RanksightTcpRetransmits",
                  "RanksightCheckpointSlow", "RanksightHeartbeatMissed", "RanksightRankDown"):
        assert verdicts[alert] == "ok", (alert, obs.triage_text)


# The dashboards' panels that cannot have data on a CPU machine: GPU (NVML) and RDMA metrics, and
# MFU (the model FLOP/s over the GPU's peak, which only NVML names).
# The CUDA memory peaks' records too: they read only peaks above 0, none on a CPU. (GPU-hours are
# ranks times hours: a CPU job has them.)
_GPU_RDMA = re.compile(r"\b(ranksight_gpu_(?!hours)\w+|gpu:ranksight_\w+|ranksight_rdma_\w+|ranksight_mfu\b|"
                       r"(rank|job):ranksight_cuda_memory_\w+)")
# The firing-alerts panel is empty for a healthy job by definition; it must show the fault run's alerts.
_FIRING = re.compile(r'ALERTS\{[^}]*alertstate="firing"')


@pytest.mark.netns
def test_every_dashboard_query_returns_data_from_the_real_runs(suite: Suite) -> None:
    from ranksight.dashboards.generate import abnormal_only, feature_only, queries, substitute

    healthy = suite.observe("healthy")
    _check_ok(healthy)
    assert healthy.dashboards, "no dashboard queries were evaluated"
    empty = {(f, t, e) for f, t, e, n in healthy.dashboards if n == 0}
    cpu_impossible = {(f, t, e) for f, t, e, _ in healthy.dashboards if _GPU_RDMA.search(e)}
    firing_panel = {(f, t, e) for f, t, e, _ in healthy.dashboards if _FIRING.search(e)}
    assert firing_panel, "the triage dashboard has no firing-alerts panel"
    # panels that draw only abnormal series (XID errors, PCIe below max, ranks down): nothing while healthy
    abnormal = abnormal_only(suite.cfg)
    abnormal_panels = {(f, t, e) for f, t, e, _ in healthy.dashboards if (f, t) in abnormal}
    assert abnormal_panels - cpu_impossible, "no abnormal-only panel that a CPU machine can show"
    # the rows of a feature no e2e job uses (pipeline stages, ranksight act): their own real-process
    # tests (test_integrations_pipeline.py, test_act_recovery.py) run the feature
    feature = feature_only(suite.cfg)
    feature_panels = {(f, t, e) for f, t, e, _ in healthy.dashboards if (f, t) in feature}
    assert feature_panels and feature_panels <= empty, "a feature panel shows data in a job without the feature"
    assert empty - cpu_impossible - firing_panel - abnormal_panels - feature_panels == set(), \
        "dashboard queries without data from the healthy run:\n" + "\n".join(
            f"{f} | {t} | {e}" for f, t, e in sorted(empty - cpu_impossible - firing_panel - abnormal_panels
                                                       - feature_panels))
    assert abnormal_panels <= empty, "an abnormal-only panel shows something during the healthy run: " + "; ".join(
        f"{f} | {t} | {e}" for f, t, e in sorted(abnormal_panels - empty))
    assert cpu_impossible <= empty, "a GPU/RDMA query returned data on a CPU machine?"
    # ... and shows the fault: the ranks-down table lists the killed rank (evaluated over the suite so far,
    # as the table would have shown it at some instant; the kill-rank job ran in an earlier group)
    kill = suite.observe("kill-rank")
    _check_ok(kill)
    down = ("ranksight-node.json", "Ranks on these nodes")
    assert down in abnormal
    exprs = [e for f, t, e in queries(suite.cfg) if (f, t) == down]
    assert len(exprs) == 1
    assert suite.stack is not None
    window = int(time.monotonic() - suite.t0) + 60
    expr = substitute(exprs[0], job=[kill.job], rate_interval="15s", range_="5m")
    shown = suite.stack.prom.query(f"last_over_time(({expr})[{window}s:5s])")
    assert CASES["kill-rank"].where["rank"] in {s["metric"].get("rank") for s in shown}, (expr, shown)
    loss = suite.observe("packet-loss")
    _check_ok(loss)
    loss_counts = {(f, t, e): n for f, t, e, n in loss.dashboards}
    assert all(loss_counts[k] > 0 for k in firing_panel), "the firing-alerts panel is empty during a fault"
    assert all(loss_counts[k] == 0 for k in cpu_impossible)
