"""ranksight.hooks across real rank processes: 2-rank gloo DDP and FSDP2 on this CPU machine.

Each job runs tests/hooks_workloads/ddp_worker.py in two processes (free TCP port for the
gloo rendezvous, one thread per rank) against a UDP receiver on a free port; every
datagram must pass protocol.decode.
"""
from __future__ import annotations

import statistics
import threading

import pytest

pytest.importorskip("torch")

from hooks_workloads.harness import Receiver, run_ranks  # noqa: E402


def job(args, env=None, timeout=120):
    rx = Receiver()
    try:
        res = run_ranks("ddp_worker.py", args, 2, rx.url, timeout=timeout, env=env)
        for r in res:
            assert r["rc"] == 0 and r["result"], r["err"][-3000:]
        rx.wait_for(lambda: len({b["rank"] for b in rx.of("bye")}) >= 2, 3)  # each rank sends BYE_COPIES
    finally:
        rx.close()
    assert not rx.invalid, f"hooks sent datagrams that fail validation: {rx.invalid[:3]}"
    return rx, res


def med(steps, f):
    return statistics.median(f(s) for s in steps)


def busy(s):
    """The straggler rule's busy time: step - data wait - exposed comm - checkpoint."""
    return s["dur"] - s["data"] - s["xcomm"] - s["ckpt"]


@pytest.fixture(scope="module")
def slow_data_job(tmp_path_factory):
    """Rank 1's loader sleeps 20 ms per batch; manual sync+async all_reduce each step; rank 0
    saves a checkpoint mid-run; the console table is on every 5 steps."""
    d = tmp_path_factory.mktemp("ckpt")
    return job(["--steps", "16", "--slow-data-rank", "1", "--data-sleep", "0.02", "--manual", "--ckpt-dir", str(d),
                "--verify"],
               env={"RANKSIGHT__hooks__table_every_steps": "5", "RANKSIGHT__hooks__table_min_seconds": "0"})


def test_ddp_dataloader_wait_on_the_slow_loader_rank_only(slow_data_job):
    rx, _ = slow_data_job
    s0, s1 = rx.of("step", 0)[1:], rx.of("step", 1)[1:]
    assert len(s0) == len(s1) == 15
    assert 0.019 <= med(s1, lambda s: s["data"]) <= 0.06
    assert med(s0, lambda s: s["data"]) < 0.003
    share1 = sum(s["data"] for s in s1) / sum(s["dur"] for s in s1)
    share0 = sum(s["data"] for s in s0) / sum(s["dur"] for s in s0)
    assert share1 > 0.3 and share0 < 0.1, (share0, share1)
    # the fast-loader rank waits for the slow one inside the gradient all-reduce: exposed comm
    assert med(s0, lambda s: s["xcomm"]) > 0.01


def test_ddp_comm_time_counted_and_bounded(slow_data_job):
    rx, res = slow_data_job
    for r in res:
        # gloo: DDP's all-reduce is timed by its own reducer timer, not a Python comm hook (see comm.py)
        assert r["result"]["stats"]["ddp_stats"] is True and r["result"]["stats"]["ddp_comm_hook"] is False
        assert r["result"]["stats"]["herr"] == 0
        assert r["result"]["stats"]["matches_local_training"] is True  # our comm hook averages gradients right
    for rank in (0, 1):
        for s in rx.of("step", rank):
            assert 0 < s["comm"] <= s["dur"] and 0 <= s["xcomm"] <= s["dur"]
            assert s["fwd"] > 0 and s["bwd"] > 0 and s["opt"] > 0 and s["micro"] == 1


def test_ddp_checkpoint_and_console_table(slow_data_job):
    rx, res = slow_data_job
    ck = rx.of("ckpt")
    assert len(ck) == 1 and ck[0]["rank"] == 0 and ck[0]["src"] == "torch.save" and ck[0]["ok"] and ck[0]["bytes"] > 0
    with_ckpt = [s for s in rx.of("step", 0) if s["ckpt"] > 0]
    assert len(with_ckpt) == 1 and with_ckpt[0]["ckpt"] >= ck[0]["dur"] * 0.99
    assert res[0]["err"].count("ranksight step time") >= 3  # rank 0 prints the table
    assert "ranksight step time" not in res[1]["err"]
    assert {r["rank"] for r in rx.of("hello")} == {0, 1} and {r["ws"] for r in rx.of("hello")} == {2}


def test_ddp_straggler_busy_time_and_gradient_accumulation():
    """Rank 1 computes 15 ms longer per micro-batch; 4 micro-batches per optimizer step."""
    rx, res = job(["--steps", "8", "--accum", "4", "--slow-compute-rank", "1", "--compute-sleep", "0.015", "--verify"])
    assert all(r["result"]["stats"]["matches_local_training"] is True for r in res)
    s0, s1 = rx.of("step", 0), rx.of("step", 1)
    assert [s["seq"] for s in s0] == [s["seq"] for s in s1] == list(range(1, 9))  # steps = optimizer steps
    assert all(s["micro"] == 4 for s in s0 + s1)
    fast, slow = med(s0[1:], busy), med(s1[1:], busy)
    # step times match (synchronous DDP) but the fast rank shows its wait as exposed comm
    assert slow >= 0.055 and slow > 2 * fast and slow - fast > 0.03, (fast, slow)
    assert med(s0[1:], lambda s: s["xcomm"]) > 0.03


def test_hang_heartbeats_tell_the_stuck_rank_from_the_waiting_one():
    """Rank 1 is stuck twice for 2 s: at step 3 outside any collective (rank 0 waits in a manual
    all_reduce), at step 5 inside forward (rank 0 waits in DDP's C++ all-reduce, seen through the
    Flight Recorder's status). The stuck rank has no collective in flight; the waiting one has
    one, in flight for as long as it waits. A user comm hook is registered: on gloo DDP's own
    timer still times the all-reduce, and the hook's wrapped calls are not counted twice."""
    rx, res = job(["--steps", "7", "--hang-rank", "1", "--hang-step", "3", "--fwd-hang-step", "5",
                   "--hang-secs", "2", "--user-comm-hook"], env={"RANKSIGHT__hooks__heartbeat_seconds": "0.2"})
    for step, phase0 in ((3, "other"), (5, "backward")):
        waiting = [h for h in rx.of("hb", 0) if h["probe"] >= 1.0 and h["step"] == step]
        stuck = [h for h in rx.of("hb", 1) if h["probe"] >= 1.0 and h["step"] == step]
        assert waiting and stuck, step
        assert all(h["coll"] >= 0.8 for h in waiting), (step, waiting)  # blocked in a collective
        assert all(h["phase"] == phase0 for h in waiting), (step, waiting)
        assert all(h["coll"] == -1 for h in stuck), (step, stuck)  # not in any collective
    for r in res:
        assert r["result"]["stats"]["ddp_stats"] is True
    for rank in (0, 1):
        assert all(0 < s["comm"] <= s["dur"] for s in rx.of("step", rank)[1:])


def test_fsdp2_fully_shard_on_gloo():
    rx, res = job(["--steps", "6", "--wrap", "fsdp2"])
    for rank in (0, 1):
        steps = rx.of("step", rank)
        assert [s["seq"] for s in steps] == list(range(1, 7))
        for s in steps:
            assert 0 < s["comm"] <= s["dur"] and 0 < s["xcomm"] <= s["dur"] and s["fwd"] > 0 and s["bwd"] > 0
    assert all(r["result"]["stats"]["herr"] == 0 for r in res)


def test_ddp_comm_between_timer_reads_follows_each_step():
    """gloo DDP's reducer timer is read on iterations 1-10 and every 20th (hooks.ddp_stats_every);
    the steps in between are estimated from this backward's duration. Rank 1's loader sleeps
    30 ms on every 7th batch only, so rank 0 waits in the all-reduce on those steps: the estimate
    must show the wait on exactly those steps, not spread it over the others."""
    rx, res = job(["--steps", "40", "--slow-data-rank", "1", "--data-sleep", "0.03", "--data-sleep-every", "7"])
    st = res[0]["result"]["stats"]
    assert st["ddp_stats"] is True and st["herr"] == 0 and st["ddp_stats_resyncs"] == 0
    assert st["ddp_stats_read"] >= 10 and st["ddp_stats_estimated"] >= 25, st
    steps = {s["seq"]: s for s in rx.of("step", 0)}
    assert sorted(steps) == list(range(1, 41))
    estimated = [q for q in range(11, 41) if q % 20]
    slow = [q for q in estimated if q % 7 == 0]  # batch i sleeps when i % 7 == 6: step i + 1
    assert slow == [14, 21, 28, 35]
    for q in slow:
        assert steps[q]["xcomm"] >= 0.02, (q, steps[q])
        assert steps[q]["xcomm"] <= steps[q]["comm"] <= steps[q]["dur"]
    others = [steps[q] for q in estimated if q not in slow]
    assert med(others, lambda s: s["xcomm"]) < 0.005
    for rank in (0, 1):
        for s in rx.of("step", rank):
            assert 0 < s["comm"] <= s["dur"] and 0 <= s["xcomm"] <= s["dur"], s


def test_async_collective_on_cpu_sets_the_launch_time():
    """On gloo (no CUDA timeline) an async_op=True collective still records its host launch time:
    the backward wrapper uses it to split gradient computation from the communication tail."""
    import torch
    import torch.distributed as dist

    from ranksight.hooks.comm import CommTracker
    from hooks_workloads.harness import free_port

    errors = []
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        tr = CommTracker(lambda what, e: errors.append((what, e)), threading.get_ident(), None, comm_events=False)
        wrapped = tr.wrap_collective("all_reduce", dist.all_reduce)
        t = torch.ones(4)
        tr.last_launch = (-1.0, None)
        wrapped(t)  # synchronous
        sync_launch = tr.last_launch[0]
        assert sync_launch > 0
        tr.last_launch = (-1.0, None)
        work = wrapped(t, async_op=True)
        work.wait()
        assert tr.last_launch[0] >= sync_launch and tr.last_launch[1] is None
        assert errors == []
    finally:
        dist.destroy_process_group()
