"""ranksight.hooks in one process: plain loops, transport, config, checkpoints, errors, unwatch.

Every datagram the hooks send goes to a real UDP receiver on a free loopback port and must
pass protocol.decode. Multi-rank (gloo DDP/FSDP) behaviour is in test_hooks_dist.py.
"""
from __future__ import annotations

import io
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402

import ranksight  # noqa: E402
from ranksight.hooks import watcher as watcher_mod  # noqa: E402

from hooks_workloads.harness import REPO, free_port, rank_env, with_detail  # noqa: E402

FAST = with_detail({"hooks": {"heartbeat_seconds": 0.05, "table_every_steps": 0, "table_every_seconds": 0}})


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith("RANKSIGHT") or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(k, raising=False)
    torch.set_num_threads(1)
    yield
    ranksight.unwatch()


def make(n_batches=8, batch=8):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(batch, 16), torch.randn(batch, 2)) for _ in range(n_batches)]
    return model, opt, data


def train(model, opt, loader, accum=1, step_sleep=0.0):
    for i, (x, y) in enumerate(loader):
        loss = ((model(x) - y) ** 2).mean() / accum
        loss.backward()
        if (i + 1) % accum == 0:
            opt.step()
            opt.zero_grad()
        if step_sleep:
            time.sleep(step_sleep)


def flush(rx, n_steps, timeout=5.0):
    assert rx.wait_for(lambda: len(rx.of("step")) >= n_steps, timeout), f"got {len(rx.of('step'))} steps"


# ---------------------------------------------------------------------------------- plain loop
def test_watch_without_process_group_plain_loop(rx):
    assert not dist.is_initialized()
    model, opt, data = make(10)
    loader = ranksight.watch(model, opt, data, agent=rx.url, config=FAST)
    assert len(loader) == 10
    train(model, opt, loader, step_sleep=0.005)
    flush(rx, 10)
    ranksight.unwatch()
    assert rx.wait_for(lambda: rx.of("bye"))
    steps = rx.of("step")
    assert [s["seq"] for s in steps] == list(range(1, 11))
    for s in steps:
        assert s["rank"] == 0 and s["ws"] == 1 and s["micro"] == 1 and s["job"]
        assert s["dur"] >= (0.004 if s["seq"] > 1 else 0)  # the sleep after a step belongs to the next
        assert 0 <= s["data"] <= s["dur"] and 0 < s["fwd"] < s["dur"] and 0 < s["bwd"] < s["dur"]
        assert 0 < s["opt"] < s["dur"] and 0 < s["b2o"] <= s["dur"]
        assert s["comm"] == 0 and s["xcomm"] < 0.005 and s["ckpt"] == 0 and s["herr"] == 0
    hello = rx.of("hello")
    assert len(hello) == 1 and "torch" in hello[0]["info"] and hello[0]["info"]["gpus"] == 0
    assert hello[0]["dirs"]["tmp"] and hello[0]["info"]["free_tmp_bytes"] > 0
    hbs = rx.of("hb")
    assert hbs and all(h["every"] == 0.05 and h["phase"] in ("idle", "data", "forward", "backward", "optimizer",
                                                             "other", "checkpoint") for h in hbs)
    assert max(h["step"] for h in hbs) >= 1


def test_gradient_accumulation_counts_optimizer_steps(rx):
    model, opt, data = make(16)
    loader = ranksight.watch(model, opt, data, agent=rx.url, config=FAST)
    train(model, opt, loader, accum=4)
    flush(rx, 4)
    time.sleep(0.1)
    steps = rx.of("step")
    assert len(steps) == 4 and [s["micro"] for s in steps] == [4, 4, 4, 4]


def test_dataloader_wait_is_time_in_next(rx):
    model, opt, _ = make()

    def slow_batches():
        for _ in range(6):
            time.sleep(0.02)
            yield torch.randn(8, 16), torch.randn(8, 2)

    loader = ranksight.watch(model, opt, slow_batches(), agent=rx.url, config=FAST)
    train(model, opt, loader)
    flush(rx, 6)
    for s in rx.of("step"):
        assert 0.018 <= s["data"] <= s["dur"]


def test_identity_from_environment(rx, monkeypatch):
    monkeypatch.setenv("RANKSIGHT_JOB", "my-job")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    model, opt, data = make(2)
    train(model, opt, ranksight.watch(model, opt, data, agent=rx.url, config=FAST))
    flush(rx, 2)
    s = rx.of("step")[0]
    assert (s["job"], s["rank"], s["ws"], s["lr"], s["restart"]) == ("my-job", 3, 8, 1, 2)
    assert s["node"] == socket.gethostname()[:128]


def test_job_name_order():
    from ranksight.hooks.identity import job_name

    assert job_name({"RANKSIGHT_JOB": "a", "TORCHELASTIC_RUN_ID": "b", "SLURM_JOB_ID": "c"}, "x.py") == "a"
    assert job_name({"TORCHELASTIC_RUN_ID": "b", "SLURM_JOB_ID": "c"}, "x.py") == "x-c"
    assert job_name({"TORCHELASTIC_RUN_ID": "b"}, "x.py") == "x-b"
    assert job_name({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "c"}, "x.py") == "x-c"
    assert job_name({}, "/path/train.py") == "train"


# ---------------------------------------------------------------------------------- transport / config
def test_unreachable_agent_never_reaches_the_loop(tmp_path):
    dead = free_port(udp=True)  # a free port with nobody listening
    for agent in (f"udp://127.0.0.1:{dead}", f"unix://{tmp_path}/missing.sock"):
        model, opt, data = make(6)
        loader = ranksight.watch(model, opt, data, agent=agent, config=FAST)
        w = ranksight.hooks.current()
        train(model, opt, loader, step_sleep=0.01)
        time.sleep(0.2)
        st = w.stats()
        ranksight.unwatch()
        assert st["steps"] == 6 and st["herr"] == 0
        assert st["send_errors"] >= 1, (agent, st)


def test_unix_socket_agent(tmp_path):
    from ranksight import protocol

    path = str(tmp_path / "agent.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(path)
    srv.settimeout(2)
    model, opt, data = make(3)
    train(model, opt, ranksight.watch(model, opt, data, agent=f"unix://{path}", config=FAST))
    ranksight.unwatch()
    kinds = set()
    srv.settimeout(0.5)
    try:
        while True:
            kinds.add(protocol.decode(srv.recv(protocol.MAX_DATAGRAM + 1))["t"])
    except socket.timeout:
        pass
    srv.close()
    assert {"hello", "steps", "bye"} <= kinds


def test_broken_config_falls_back_to_defaults(rx, monkeypatch, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="ranksight.hooks")
    monkeypatch.setenv("RANKSIGHT__hooks__heartbeat_seconds", "not-a-number")
    s = watcher_mod.load_settings()
    assert s.heartbeat_seconds == 1.0 and s.table_every_steps == 100
    assert any("heartbeat_seconds" in r.getMessage() for r in caplog.records)
    monkeypatch.delenv("RANKSIGHT__hooks__heartbeat_seconds")
    bad = tmp_path / "bad.yaml"
    bad.write_text("hooks: [unclosed\n")
    monkeypatch.setenv("RANKSIGHT_CONFIG", str(bad))
    assert watcher_mod.load_settings().heartbeat_seconds == 1.0
    monkeypatch.delenv("RANKSIGHT_CONFIG")
    monkeypatch.setenv("RANKSIGHT_AGENT", "tcp://nope")
    assert str(watcher_mod.load_settings().agent) == "udp://127.0.0.1:9946"
    monkeypatch.setenv("RANKSIGHT_AGENT", "off")
    assert str(watcher_mod.load_settings().agent) == "off"
    # and a whole run with a broken value still trains and reports
    monkeypatch.setenv("RANKSIGHT__hooks__max_pending_events", "-5")
    model, opt, data = make(3)
    train(model, opt, ranksight.watch(model, opt, data, agent=rx.url))
    flush(rx, 3)


def test_env_config_overrides_reach_the_hooks(monkeypatch):
    monkeypatch.setenv("RANKSIGHT__hooks__heartbeat_seconds", "0.25")
    monkeypatch.setenv("RANKSIGHT_AGENT", "unix:///tmp/x.sock")
    s = watcher_mod.load_settings()
    assert s.heartbeat_seconds == 0.25 and str(s.agent) == "unix:///tmp/x.sock"


# ---------------------------------------------------------------------------------- errors in hooks
@pytest.mark.parametrize("target", ["_step_end", "_bwd_done", "_perf", "encode", "_probe"])
def test_exception_inside_a_hook_never_reaches_the_loop(rx, monkeypatch, caplog, target):
    """An internal that raises: in a step-path hook (_step_end, _bwd_done), in every hook at
    once (the clock), in the background thread (encode, _probe). Training runs on; each error is
    counted and each failing site is logged once."""
    caplog.set_level(logging.WARNING, logger="ranksight.hooks")
    calls = []

    def boom(*a, **k):
        calls.append(1)
        raise RuntimeError("injected")

    model, opt, data = make(6)
    loader = ranksight.watch(model, opt, data, agent=rx.url, config=FAST)
    w = ranksight.hooks.current()
    if target == "_perf":
        from ranksight.hooks import steppath

        monkeypatch.setattr(steppath, "_perf", boom)  # the step path's clock
    elif target == "encode":
        monkeypatch.setattr(watcher_mod.protocol, "encode", boom)
    else:
        monkeypatch.setattr(watcher_mod.Watcher, target, boom)
    train(model, opt, loader, step_sleep=0.02)  # must not raise
    time.sleep(0.15)
    assert calls and w.herr >= 1
    msgs = [r.getMessage() for r in caplog.records if "injected" in r.getMessage()]
    assert msgs and len(msgs) == len(set(msgs)), msgs  # each failing site logged once, not once per step
    if target in ("_step_end", "_bwd_done"):
        assert w.herr >= 6 and len(msgs) == 1
        assert rx.wait_for(lambda: any(h["herr"] >= 6 for h in rx.of("hb")))
    ranksight.unwatch()


@pytest.fixture
def world1():
    """A one-rank gloo process group in this process, destroyed afterwards."""
    from hooks_workloads.harness import free_port

    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}")
    yield
    ranksight.unwatch()
    dist.destroy_process_group()


def test_exception_in_collective_bookkeeping_keeps_the_collective(world1, monkeypatch, caplog):
    """The wrapped collective still runs, and its own errors still reach the caller unchanged,
    when our bookkeeping raises."""
    from ranksight.hooks import comm

    caplog.set_level(logging.WARNING, logger="ranksight.hooks")
    ranksight.watch(None, None, None, agent="off")
    w = ranksight.hooks.current()

    def boom(*a, **k):
        raise RuntimeError("injected")

    monkeypatch.setattr(comm.CommTracker, "launch", boom)
    t = torch.ones(3)
    dist.all_reduce(t)
    assert t.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(Exception) as unwatched_err:
        dist.distributed_c10d.all_reduce("not a tensor")
    with pytest.raises(type(unwatched_err.value)) as err:
        dist.all_reduce("not a tensor")
    assert str(err.value) == str(unwatched_err.value)
    assert w.herr == 2
    assert len([r for r in caplog.records if "injected" in r.getMessage()]) == 1


def test_manual_collectives_are_timed_and_exposed(world1, rx):
    model, opt, data = make(4)
    loader = ranksight.watch(model, opt, data, agent=rx.url, config=FAST)
    for x, y in loader:
        ((model(x) - y) ** 2).mean().backward()
        t = torch.ones(1 << 16)
        dist.all_reduce(t)  # synchronous
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        dist.barrier()
        opt.step()
        opt.zero_grad()
    done = time.time()
    flush(rx, 4)
    for s in rx.of("step"):
        assert 0 < s["comm"] <= s["dur"] and 0 < s["xcomm"] <= s["dur"]
    late = lambda: [h for h in rx.of("hb") if h["ts"] > done + 0.3]  # noqa: E731
    assert rx.wait_for(late)
    assert all(h["coll"] == -1 for h in late()), late()  # nothing left in flight


# ---------------------------------------------------------------------------------- unwatch
def ours(hooks):
    """Hooks that belong to the Watcher (the lints manage their own); a module's come wrapped in
    CopySafe (hooks/copysafe.py)."""
    return sum(isinstance(getattr(getattr(h, "fn", h), "__self__", None), watcher_mod.Watcher) for h in hooks.values())


def test_unwatch_and_context_manager_restore_everything(rx):
    import torch.distributed.distributed_c10d as c10d

    model, opt, data = make(4)
    before = (torch.save, dist.all_reduce, dist.barrier, dist.Work.wait, torch.serialization.save,
              torch.autograd.backward)
    with ranksight.watch(model, opt, data, agent=rx.url, config=FAST) as loader:
        assert torch.save is not before[0] and dist.all_reduce is not before[1]
        assert dist.Work.wait is not before[3] and torch.autograd.backward is not before[5]
        assert ours(opt._optimizer_step_pre_hooks) == 1 and ours(opt._optimizer_step_post_hooks) == 1
        assert ours(model._forward_hooks) == 1 and ours(model._forward_pre_hooks) == 1
        train(model, opt, loader)
    assert ranksight.hooks.current() is None
    assert (torch.save, dist.all_reduce, dist.barrier, dist.Work.wait, torch.serialization.save,
            torch.autograd.backward) == before
    assert c10d.all_reduce is before[1]
    assert ours(opt._optimizer_step_pre_hooks) == 0 and ours(opt._optimizer_step_post_hooks) == 0
    assert ours(model._forward_hooks) == 0 and ours(model._forward_pre_hooks) == 0
    assert rx.wait_for(lambda: rx.of("bye"))
    n = len(rx.of("step"))
    train(model, opt, iter(data))  # unwatched: nothing more is sent
    time.sleep(0.1)
    assert len(rx.of("step")) == n == 4


def test_second_watch_replaces_the_first(rx):
    model, opt, data = make(2)
    ranksight.watch(model, opt, data, agent=rx.url, config=FAST)
    first = ranksight.hooks.current()
    loader = ranksight.watch(model, opt, data, agent=rx.url, config=FAST)
    assert ranksight.hooks.current() is not first and first._closed
    assert len(opt._optimizer_step_post_hooks) == 1
    train(model, opt, loader)
    flush(rx, 2)


# ---------------------------------------------------------------------------------- checkpoints
def test_torch_save_and_atomic_save_record_duration_and_bytes(rx, tmp_path):
    model, opt, data = make(4)
    seen = []
    loader = ranksight.watch(model, opt, data, agent=rx.url, config=FAST)
    ranksight.hooks.current().add_checkpoint_observer(lambda src, obj, path: seen.append((src, type(obj).__name__)))
    for i, (x, y) in enumerate(loader):
        ((model(x) - y) ** 2).mean().backward()
        if i == 1:
            torch.save(model.state_dict(), tmp_path / "a.pt")
            with open(tmp_path / "b.pt", "wb") as f:
                torch.save({"opt": opt.state_dict()}, f)
            torch.save(model.state_dict(), io.BytesIO())  # in memory: not a checkpoint write
            n = ranksight.atomic_save({"model": model.state_dict()}, tmp_path / "c.pt")
            with ranksight.checkpoint_timer(tmp_path / "a.pt"):
                time.sleep(0.01)
        opt.step()
        opt.zero_grad()
    flush(rx, 4)
    assert rx.wait_for(lambda: len(rx.of("ckpt")) >= 4)
    ck = {c["src"]: c for c in rx.of("ckpt")}
    assert sorted(c["src"] for c in rx.of("ckpt")) == ["atomic_save", "timer", "torch.save", "torch.save"]
    sizes = sorted(c["bytes"] for c in rx.of("ckpt") if c["src"] == "torch.save")
    assert sizes == sorted([os.path.getsize(tmp_path / "a.pt"), os.path.getsize(tmp_path / "b.pt")])
    assert ck["atomic_save"]["bytes"] == n == os.path.getsize(tmp_path / "c.pt") and ck["atomic_save"]["ok"]
    assert ck["timer"]["bytes"] == os.path.getsize(tmp_path / "a.pt") and ck["timer"]["dur"] >= 0.01
    assert all(c["ok"] and c["dur"] > 0 for c in rx.of("ckpt"))
    assert torch.load(tmp_path / "c.pt")["model"].keys() == model.state_dict().keys()
    assert not [p for p in os.listdir(tmp_path) if ".tmp." in p]
    step2 = rx.of("step")[1]
    assert step2["ckpt"] >= ck["timer"]["dur"] and step2["ckpt"] < step2["dur"]
    assert ("torch.save", "OrderedDict") in seen and ("atomic_save", "dict") in seen


def test_failed_save_is_recorded_and_the_exception_reaches_the_caller(rx, tmp_path):
    """A save into a read-only directory raises exactly what it raises unwatched, and the write is
    recorded as failed. Root ignores directory permissions, so the saving process drops to an
    unprivileged user first (a subprocess), as a real job would run."""
    code = r"""
import io, os, sys, tempfile, time, torch, ranksight
m = torch.nn.Linear(2, 2)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
torch.save(m.state_dict(), io.BytesIO())  # imports done while we may still read the interpreter's files
def attempt(fn):
    try:
        fn()
        return "NO_ERROR"
    except Exception as e:
        return f"{type(e).__name__}: {e}"
ranksight.watch(m, opt, None)
w = ranksight.hooks.current()
while w.stats()["sent"] < 1:  # the socket is open
    time.sleep(0.01)
if os.geteuid() == 0:
    os.setgid(65534); os.setuid(65534)
d = tempfile.mkdtemp()
os.chmod(d, 0o555)
save = lambda: torch.save(m.state_dict(), os.path.join(d, "x.pt"))
atomic = lambda: ranksight.atomic_save(m.state_dict(), os.path.join(d, "y.pt"))
watched = attempt(save), attempt(atomic)
ranksight.unwatch()
plain = attempt(save), attempt(atomic)
print("SAME" if plain == watched else f"DIFFERENT {plain} {watched}")
print("ERRORS", plain)
print("LEFT", sorted(os.listdir(d)))
"""
    out = subprocess.run([sys.executable, "-c", code], env=rank_env(rx.url), capture_output=True, text=True,
                         timeout=90, cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "SAME" in out.stdout and "NO_ERROR" not in out.stdout, out.stdout
    assert "Permission denied" in out.stdout and "LEFT []" in out.stdout
    assert rx.wait_for(lambda: len(rx.of("ckpt")) >= 2)
    cks = rx.of("ckpt")
    assert sorted(c["src"] for c in cks) == ["atomic_save", "torch.save"]
    assert all(c["ok"] is False and c["bytes"] == 0 for c in cks)


def test_checkpoint_timer_failure_and_unwatched_use(rx, tmp_path):
    with ranksight.checkpoint_timer() as ck:  # no watch: only measures
        time.sleep(0.005)
    assert ck.seconds >= 0.005 and ck.ok
    model, opt, data = make(1)
    ranksight.watch(model, opt, data, agent=rx.url, config=FAST)
    with pytest.raises(KeyError):
        with ranksight.checkpoint_timer(tmp_path, nbytes=123):
            raise KeyError("boom")
    with ranksight.checkpoint_timer(nbytes=77) as ck:
        ck.bytes = 99
    assert rx.wait_for(lambda: len(rx.of("ckpt")) >= 2)
    a, b = rx.of("ckpt")
    assert (a["ok"], a["bytes"], b["ok"], b["bytes"]) == (False, 0, True, 99)


def test_dcp_save_is_recorded(rx, tmp_path):
    import torch.distributed.checkpoint as dcp

    orig = dcp.save
    model, opt, data = make(1)
    ranksight.watch(model, opt, data, agent=rx.url, config=FAST)
    assert dcp.save is not orig
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(tmp_path / "dcp"), no_dist=True)
    ranksight.unwatch()
    assert dcp.save is orig
    assert rx.wait_for(lambda: rx.of("ckpt"))
    c = rx.of("ckpt")[0]
    total = sum(os.path.getsize(tmp_path / "dcp" / f) for f in os.listdir(tmp_path / "dcp"))
    assert c["src"] == "dcp" and c["ok"] and 0 < c["bytes"] <= total


@pytest.mark.parametrize("callbacks", ["prompt", "late", "slow-record"],
                         ids=["callbacks", "callbacks-after-unwatch", "record-in-flight-at-unwatch"])
def test_dcp_async_save_blocks_its_step_for_the_staging_and_records_the_write(rx, tmp_path, monkeypatch,
                                                                             callbacks):
    """A real ``dcp.async_save`` whose background write takes 0.6 s: the step that launched it
    holds only the staging ("ckpt" of the step, summed as tot["ckpt"]); the "ckpt" record and
    tot["ckpt_s"] hold the whole write, launch to completion. ``Future.result()`` returns before
    the future's callbacks run; with them held back until after ``unwatch()`` ("late"), or with
    the callback still reading the checkpoint's size when ``unwatch()`` runs ("slow-record"), the
    record still goes out with the watch's last records."""
    import concurrent.futures
    import threading
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from ranksight.hooks import checkpoint as checkpoint_mod

    if callbacks == "slow-record":
        size = checkpoint_mod.Recorder._dcp_bytes

        def slow_size(path):
            if threading.current_thread() is not threading.main_thread():
                time.sleep(1.0)  # the callback descheduled between taking the save and emitting it
            return size(path)

        monkeypatch.setattr(checkpoint_mod.Recorder, "_dcp_bytes", staticmethod(slow_size))
    if callbacks == "late":
        invoke = concurrent.futures.Future._invoke_callbacks

        def late(self):
            time.sleep(1.0)  # the completing thread descheduled after it woke result()
            invoke(self)

        monkeypatch.setattr(concurrent.futures.Future, "_invoke_callbacks", late)

    class SlowWriter(FileSystemWriter):
        def write_data(self, plan, planner):  # runs on DCP's background thread
            time.sleep(0.6)
            return super().write_data(plan, planner)

    model, opt, data = make(12)
    loader = ranksight.watch(model, opt, data, agent=rx.url, config=FAST)
    fut = None
    for i, (x, y) in enumerate(loader):
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
        if i == 2:
            fut = dcp.async_save({"model": model.state_dict()}, no_dist=True,
                                 storage_writer=SlowWriter(str(tmp_path / "dcp")))
        time.sleep(0.05)
    getattr(fut, "upload_completion", fut).result(timeout=30)
    ranksight.unwatch()
    assert rx.wait_for(lambda: rx.of("ckpt") and rx.of("bye"))
    (c,) = rx.of("ckpt")  # DCP's own torch.save calls on its writer thread are not checkpoints
    assert c["src"] == "dcp" and c["ok"] and c["dur"] >= 0.6
    shares = [s["ckpt"] for s in rx.steps()]
    # the launching step holds the staging only: the record's duration is the staging plus the
    # write's 0.6 s sleep and more, so the step's share is at most that less 0.6 s, however long a
    # loaded machine takes to stage
    assert len(shares) == 12 and sum(1 for x in shares if x > 0) == 1
    assert 0 < max(shares) <= c["dur"] - 0.6 + 0.02, (max(shares), c["dur"])
    tot = rx.of("bye")[-1]["tot"]
    assert tot["ckpt"] == pytest.approx(sum(shares), abs=1e-6)
    assert tot["ckpt_s"] == pytest.approx(c["dur"], abs=1e-6)


def test_a_save_with_no_python_caller_writes_and_is_recorded(rx, tmp_path):
    """torch.save as a bare thread's target has no Python frame above the wrapper (as in an atexit
    callback): the wrapper's look at its caller must not fail the save."""
    import _thread

    model, opt, data = make(2)
    ranksight.watch(model, opt, data, agent=rx.url, config=FAST)
    path = tmp_path / "bare.pt"
    _thread.start_new_thread(torch.save, ({"w": torch.ones(4)}, str(path)))
    assert rx.wait_for(lambda: rx.of("ckpt"))
    ranksight.unwatch()
    (c,) = rx.of("ckpt")
    assert c["src"] == "torch.save" and c["ok"] and c["bytes"] == path.stat().st_size > 0


# ---------------------------------------------------------------------------------- heartbeat / probe / table / lints
def test_heartbeat_probe_sees_a_stuck_main_thread(rx):
    model, opt, data = make(2)
    loader = ranksight.watch(model, opt, data, agent=rx.url, config=FAST)
    train(model, opt, loader)
    time.sleep(0.6)  # the main thread sits in one C call
    ranksight.unwatch()
    hbs = rx.of("hb")
    assert max(h["probe"] for h in hbs) >= 0.4
    assert all(h["coll"] == -1 for h in hbs)
    assert hbs[-1]["step"] == 2


def test_console_table_on_rank0_and_silenced(capsys):
    def run(every):
        model, opt, data = make(12)
        cfg = {"hooks": {"table_every_steps": every, "table_every_seconds": 0, "table_min_seconds": 0,
                         "heartbeat_seconds": 0.05}}
        train(model, opt, ranksight.watch(model, opt, data, agent="off", config=cfg))
        time.sleep(0.2)
        ranksight.unwatch()
        return capsys.readouterr().err

    err = run(5)
    tables = [line for line in err.splitlines() if line.startswith("ranksight step time")]
    assert len(tables) == 3, err  # steps 1-5, 6-10, and 11-12 at unwatch
    assert "mean ms" in err and "p99 ms" in err and "x-comm" in err and "ckpt" in err
    assert "ranksight step time" not in run(0)


def test_send_lint_and_periodic_extension_points(rx):
    model, opt, data = make(2)
    loader = ranksight.watch(model, opt, data, agent=rx.url, config=FAST)
    w = ranksight.hooks.current()
    assert w.model is model and w.optimizer is opt and w.loader is data and w.process_group is None
    epochs, ticks = [], []
    w.add_epoch_observer(epochs.append)
    w.add_periodic(lambda: ticks.append(1), 0.05)
    w.send_lint("sampler_epoch", True, "DistributedSampler.set_epoch was never called")
    train(model, opt, loader)
    time.sleep(0.2)
    assert epochs == [data] and ticks
    # the lints thread reports its own checks' first states too (disk headroom at start): the record sent is found by name
    assert rx.wait_for(lambda: [x for x in rx.of("lint") if x["lint"] == "sampler_epoch"])
    lint = [x for x in rx.of("lint") if x["lint"] == "sampler_epoch"][0]
    assert lint["lint"] == "sampler_epoch" and lint["active"] is True and "set_epoch" in lint["msg"]


def test_loader_wrapper_passes_attributes_through(rx):
    from torch.utils.data import DataLoader, TensorDataset

    ds = TensorDataset(torch.randn(20, 16), torch.randn(20, 2))
    dl = DataLoader(ds, batch_size=5, drop_last=True)
    model, opt, _ = make()
    loader = ranksight.watch(model, opt, dl, agent=rx.url, config=FAST)
    assert len(loader) == 4 and loader.batch_size == 5 and loader.dataset is ds
    for _ in range(2):  # two epochs
        train(model, opt, loader)
    flush(rx, 8)


def test_hooks_package_imports_lazily_from_core():
    code = "import sys, ranksight; assert 'torch' not in sys.modules; ranksight.watch; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.stdout.strip() == "True", out.stderr


# ---------------------------------------------------------------------------------- GPU timeline (stand-in)
class _LagGPU:
    """Stand-in for ``torch.cuda`` behind ``CudaTimeline``'s interface (CUDA events cannot exist on
    this machine; the real path is tests/gpu): an event is reached ``lag`` seconds after the host
    recorded it, i.e. a GPU that runs ``lag`` behind the host (lag 0: an idle GPU, which reaches
    an event the moment it is recorded). While ``busy`` is set no event is reached (a GPU still
    working on earlier work)."""

    def __init__(self, lag: float):
        self.lag = lag
        self.busy = False
        self.cuda = self

    def current_stream(self, device=None):
        return None

    def Event(self, enable_timing=True):  # noqa: N802 (torch.cuda.Event)
        return _LagEvent(self)


class _LagEvent:
    def __init__(self, gpu: _LagGPU):
        self.gpu, self.t = gpu, None

    def record(self, stream=None):
        self.t = time.perf_counter() + self.gpu.lag

    def query(self):
        return not self.gpu.busy and self.t is not None and time.perf_counter() >= self.t

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def _on_stand_in_gpu(w, lag):
    from ranksight.hooks.timing import CudaTimeline

    tl = CudaTimeline(_LagGPU(lag), "stand-in", 256)
    tl.gpu = tl._cuda
    w._tl = w.comm.timeline = tl
    w.comm.comm_events = True
    w._read_cuda_memory = lambda: None  # no torch.cuda here
    return tl


def test_close_sends_the_last_steps_gpu_times(rx):
    """The GPU is busy for the whole loop (no interval resolves while it runs) and finishes
    0.1 s after the loop. close() must wait for the intervals (bounded, query() only) and send
    them on the step records it still holds, not drop them."""
    import threading

    model, opt, data = make(12)
    fwd_sleep = 0.004
    model.register_forward_pre_hook(lambda m, a: time.sleep(fwd_sleep))  # after ours: inside the fwd span
    loader = ranksight.watch(model, opt, data, agent=rx.url, config=FAST)
    w = ranksight.hooks.current()
    tl = _on_stand_in_gpu(w, lag=0.0)
    tl.gpu.busy = True
    train(model, opt, loader, step_sleep=0.03)  # long enough for the background thread to send some records
    assert tl.pending > 0
    threading.Timer(0.1, lambda: setattr(tl.gpu, "busy", False)).start()
    ranksight.unwatch()
    assert tl.pending == 0 and w.gpu_unsent == 0 and w.herr == 0
    flush(rx, 12)
    assert rx.wait_for(lambda: rx.of("bye"))
    steps = rx.of("step")
    assert [s["seq"] for s in steps] == list(range(1, 13))
    fwd = sum(s["fwd"] for s in steps)
    assert 12 * fwd_sleep <= fwd <= sum(s["dur"] for s in steps), fwd
    assert sum(s["bwd"] for s in steps) > 0 and sum(s["opt"] for s in steps) > 0


def test_close_waits_for_the_gpu_a_bounded_time(rx):
    """A GPU that never reaches the events: close() gives up after
    CLOSE_GPU_WAIT, sends the records it has and the "bye"."""
    model, opt, data = make(4)
    loader = ranksight.watch(model, opt, data, agent=rx.url, config=FAST)
    w = ranksight.hooks.current()
    tl = _on_stand_in_gpu(w, lag=0.0)
    tl.gpu.busy = True
    train(model, opt, loader)
    ranksight.unwatch()
    assert watcher_mod.CLOSE_GPU_WAIT <= w.gpu_wait_s < watcher_mod.CLOSE_GPU_WAIT + 0.25
    assert tl.pending == 0 and tl.dropped > 0 and w.herr == 0  # the unreached ones: released, counted
    flush(rx, 4)
    assert rx.wait_for(lambda: rx.of("bye"))


def test_async_collective_start_event_follows_the_enqueue(world1, rx, monkeypatch):
    """On a host-bound step the GPU idles while the host enqueues a collective. The start event of
    an async collective is recorded after the call returned, so that enqueue time is not comm;
    a synchronous call still counts from before the call (the call itself is the wait)."""
    enqueue = 0.03
    real = dist.all_reduce

    def slow_enqueue(*a, **k):  # a collective whose enqueue takes 30 ms of host time
        time.sleep(enqueue)
        return real(*a, **k)

    monkeypatch.setattr(dist, "all_reduce", slow_enqueue)
    model, opt, data = make(4)
    t = torch.ones(1 << 10)
    for async_op in (True, False):
        loader = ranksight.watch(model, opt, data, agent=rx.url, config=FAST)
        w = ranksight.hooks.current()
        _on_stand_in_gpu(w, lag=0.0)  # an idle GPU
        for x, y in loader:
            ((model(x) - y) ** 2).mean().backward()
            work = dist.all_reduce(t, async_op=async_op)
            if async_op:
                work.wait()
            opt.step()
            opt.zero_grad()
        ranksight.unwatch()
        # this watch's own bye (each watch sends BYE_COPIES of it): then all its steps are in
        assert rx.wait_for(lambda: any(b["sess"] == w.sess for b in rx.of("bye")))
    steps = rx.of("step")
    assert len(steps) == 8, str([(r["t"], r.get("sess"), r.get("seq")) for r in rx.records if r["t"] != "hb"])
    comm_async = sum(s["comm"] for s in steps[:4])
    comm_sync = sum(s["comm"] for s in steps[4:])
    assert comm_async < 4 * enqueue / 3, [s["comm"] for s in steps[:4]]
    assert comm_sync >= 4 * enqueue, [s["comm"] for s in steps[4:]]


def test_ddp_comm_hook_start_event_follows_the_enqueue(world1):
    """The same for DDP's buckets through our comm hook (the CUDA DDP path): the hook's start
    event is recorded once the bucket's all-reduce is enqueued."""
    from ranksight.hooks.comm import CommTracker, make_ddp_hook
    from ranksight.hooks.timing import COMM, CudaTimeline

    class SlowEnqueue:  # the hook's state: the process group, with a 30 ms enqueue
        def __init__(self, pg):
            self.pg = pg

        def size(self):
            return self.pg.size()

        def allreduce(self, tensors, opts):
            time.sleep(0.03)
            return self.pg.allreduce(tensors, opts)

    errors = []
    tl = CudaTimeline(_LagGPU(0.0), "stand-in", 256)
    tr = CommTracker(lambda where, e: errors.append((where, e)), threading_main_tid(), tl)
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(nn.Linear(8, 8))
    ddp.register_comm_hook(SlowEnqueue(dist.group.WORLD), make_ddp_hook([tr]))
    for _ in range(3):
        ddp(torch.randn(4, 8)).sum().backward()
    got = []
    tl.resolve(lambda kind, secs: got.append((kind, secs)))
    comm = [s for k, s in got if k == COMM]
    assert not errors and len(comm) == 3, (errors, got)
    assert sum(comm) < 0.03, comm  # three 30 ms enqueues, none counted


def threading_main_tid():
    import threading

    return threading.main_thread().ident
