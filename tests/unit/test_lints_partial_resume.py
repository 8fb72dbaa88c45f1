"""The partial_resume lint in one process, with a real watch and real checkpoints: what a restore
of the watched model is (hooks/resume.py) and which parts the lint names. The 2-rank job that
resumes after a restart is tests/integration/test_resume.py."""
from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import ranksight  # noqa: E402
from ranksight.hooks.active_watch import active  # noqa: E402
from ranksight.hooks.resume import counters  # noqa: E402

OFF = {"hooks": {"agent": "off", "table_every_steps": 0, "table_every_seconds": 0}}
LINT = "partial_resume"


def _train(tmp_path, *, restore=("model", "optimizer", "sched"), save=("model", "optimizer", "sched"),
           opt="adamw", sched=True, weights_only=False, steps=4):
    """Save a checkpoint after ``steps`` steps, then in a fresh watch restore ``restore`` from it and
    run ``steps`` more. Returns the second watch's lint state, its Resume and its hook errors."""
    path = tmp_path / "ckpt.pt"
    results = []
    for phase in ("first", "resumed"):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        o = torch.optim.AdamW(m.parameters(), lr=0.01) if opt == "adamw" else torch.optim.SGD(m.parameters(), lr=0.01)
        s = torch.optim.lr_scheduler.LambdaLR(o, lambda i: min(1.0, (i + 1) / 10)) if sched else None
        data = [(torch.randn(8, 4), torch.randn(8, 2)) for _ in range(steps)]
        loader = ranksight.watch(m, o, data, config=OFF)
        w = active()
        if phase == "resumed":
            ck = torch.load(path)
            m.load_state_dict(ck["model"] if not weights_only else ck)
            if "optimizer" in restore:
                o.load_state_dict(ck["optimizer"])
            if "sched" in restore and s is not None:
                s.load_state_dict(ck["sched"])
        for x, y in loader:
            loss = nn.functional.mse_loss(m(x), y)
            loss.backward()
            o.step()
            o.zero_grad()
            if s is not None:
                s.step()
        if phase == "first":
            parts = {"model": m.state_dict(), "optimizer": o.state_dict(), "sched": s.state_dict() if s else None,
                     "step": steps, "epoch": 1}
            torch.save(m.state_dict() if weights_only else {k: v for k, v in parts.items() if k in save + ("step", "epoch")},
                       path)
        results.append((w.lints.state(LINT), w.resumes.last, w.herr, w.resumes.opt_loads))
        ranksight.unwatch()
    return results[1]


def test_full_resume_is_quiet(tmp_path):
    state, resume, herr, opt_loads = _train(tmp_path)
    assert resume is not None and resume.step == 4 and resume.epoch == 1
    assert opt_loads == 1 and herr == 0
    assert state == (False, "")  # checked and found fine


def test_model_only_restore_names_the_optimizer_and_the_scheduler(tmp_path):
    state, resume, herr, _ = _train(tmp_path, restore=("model",))
    assert herr == 0 and resume is not None
    active_, msg = state
    assert active_
    assert "restored the model but not the optimizer (AdamW started with empty state: the checkpoint holds optimizer state" in msg
    assert "LR scheduler (LambdaLR) is at step 0" in msg and "at step 4" in msg


def test_optimizer_restored_from_empty_state(tmp_path):
    # the checkpoint's optimizer state was saved before any step: loading it restores nothing
    path = tmp_path / "c.pt"
    m = nn.Linear(4, 2)
    o = torch.optim.AdamW(m.parameters())
    torch.save({"model": m.state_dict(), "optimizer": o.state_dict(), "step": 3}, path)
    ranksight.watch(m, o, None, config=OFF)
    w = active()
    ck = torch.load(path)
    o.load_state_dict(ck["optimizer"])  # before the model: the order does not matter
    m.load_state_dict(ck["model"])
    nn.functional.mse_loss(m(torch.randn(2, 4)), torch.randn(2, 2)).backward()
    o.step()
    state = w.lints.state(LINT)
    ranksight.unwatch()
    assert state[0] and "optimizer.load_state_dict() was called but the state it loaded is empty" in state[1]


def test_checkpoint_without_optimizer_state(tmp_path):
    state, _, _, _ = _train(tmp_path, restore=("model", "sched"), save=("model", "sched"))
    assert state[0] and "the checkpoint holds no optimizer state" in state[1] and "scheduler" not in state[1]


def test_scheduler_alone_not_restored(tmp_path):
    state, _, _, _ = _train(tmp_path, restore=("model", "optimizer"))
    assert state[0] and "LR scheduler (LambdaLR) is at step 0" in state[1] and "optimizer (" not in state[1]


def test_stateless_optimizer_is_not_flagged(tmp_path):
    # plain SGD has no state to restore: an empty state after the restore is right
    state, resume, _, _ = _train(tmp_path, restore=("model",), opt="sgd", sched=False)
    assert resume is not None and state == (False, "")


def test_weights_only_load_is_not_a_resume(tmp_path):
    # a bare state_dict: initialization from weights (fine-tuning), the optimizer starts fresh on purpose
    state, resume, herr, _ = _train(tmp_path, restore=("model",), weights_only=True)
    assert resume is None and state is None and herr == 0


def test_sampler_epoch_not_set_after_a_resume_past_epoch_0(tmp_path):
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    class OneReplica(DistributedSampler):  # a DistributedSampler without a process group
        def __init__(self, ds):
            super().__init__(ds, num_replicas=1, rank=0, shuffle=True)

    ds = TensorDataset(torch.randn(16, 4), torch.randn(16, 2))
    m = nn.Linear(4, 2)
    o = torch.optim.AdamW(m.parameters())
    nn.functional.mse_loss(m(torch.randn(2, 4)), torch.randn(2, 2)).backward()
    o.step()  # the optimizer has state to save
    torch.save({"model": m.state_dict(), "optimizer": o.state_dict(), "epoch": 3, "step": 12}, tmp_path / "c.pt")
    for set_epoch, want in ((False, True), (True, False)):
        sampler = OneReplica(ds)
        loader = ranksight.watch(m, o, DataLoader(ds, batch_size=4, sampler=sampler), config=OFF)
        w = active()
        ck = torch.load(tmp_path / "c.pt")
        m.load_state_dict(ck["model"])
        o.load_state_dict(ck["optimizer"])
        if set_epoch:
            sampler.set_epoch(ck["epoch"])
        for x, y in loader:
            nn.functional.mse_loss(m(x), y).backward()
            o.step()
            o.zero_grad()
        state = w.lints.state(LINT)
        ranksight.unwatch()
        assert state is not None and state[0] is want, (set_epoch, state)
        if want:
            assert "DistributedSampler's epoch is 0 at the first epoch after resuming at epoch 3" in state[1]


def test_lint_switched_off(tmp_path):
    cfg = {**OFF, "lints": {LINT: False}}
    m = nn.Linear(4, 2)
    o = torch.optim.AdamW(m.parameters())
    torch.save({"model": m.state_dict(), "step": 5}, tmp_path / "c.pt")
    ranksight.watch(m, o, None, config=cfg)
    w = active()
    m.load_state_dict(torch.load(tmp_path / "c.pt")["model"])
    nn.functional.mse_loss(m(torch.randn(2, 4)), torch.randn(2, 2)).backward()
    o.step()
    assert w.resumes.last is not None and w.lints.state(LINT) is None
    ranksight.unwatch()


def test_counters_of_a_checkpoint():
    assert counters({"model": {}, "global_step": 1200, "epoch": 3}) == (1200, 3)
    assert counters({"model": {}, "train_state": {"step": torch.tensor(7), "epoch": 2}}) == (7, 2)
    assert counters({"model": {}, "step": True, "lr": 0.1}) == (0, None)


def test_a_raising_load_and_unwatched_load_pass_unchanged(tmp_path):
    m = nn.Linear(4, 2)
    ranksight.watch(m, torch.optim.AdamW(m.parameters()), None, config=OFF)
    with pytest.raises(FileNotFoundError):
        torch.load(tmp_path / "missing.pt")
    ranksight.unwatch()
    assert not getattr(torch.load, "__ranksight__", False)  # restored by unwatch()
    t0 = time.perf_counter()
    torch.save({"a": 1}, tmp_path / "x.pt")
    assert torch.load(tmp_path / "x.pt") == {"a": 1} and time.perf_counter() - t0 < 5


def test_the_restore_hook_does_not_follow_a_copy_of_the_model(tmp_path):
    # an EMA copy (deepcopy) or a pickled module carries the load post-hook as a no-op
    import copy
    import pickle

    from ranksight.hooks.resume import ResumeWatch

    errors = []
    rw = ResumeWatch(lambda where, e: errors.append((where, e)))
    m = nn.Sequential(nn.Linear(4, 2))
    handles: list = []
    rw.attach_model(m, handles)
    ema = copy.deepcopy(m)
    pickle.loads(pickle.dumps(m))
    rw.on_load({"model": m.state_dict(), "step": 3}, str(tmp_path / "c.pt"))
    ema.load_state_dict(m.state_dict())
    assert rw.last is None
    m.load_state_dict(ema.state_dict())
    assert rw.last is not None and rw.last.step == 3 and not errors
    for h in handles:
        h.remove()


def test_recorded_v5_session_reports_the_resume_and_the_total():
    # tests/fixtures/protocol/record_v5.py: the second session restores the step-6 checkpoint
    import json
    from pathlib import Path

    lines = (Path(__file__).resolve().parents[1] / "fixtures" / "protocol" / "v5.decoded.jsonl").read_text().splitlines()
    steps = [json.loads(x) for x in lines if '"t":"steps"' in x]
    sessions = list(dict.fromkeys(r["sess"] for r in steps))
    first = [r for r in steps if r["sess"] == sessions[0]]
    second = [r for r in steps if r["sess"] == sessions[1]]
    assert all(r["total"] == 18 for r in steps)
    assert all(r["resumed"] == 0 and r["rstep"] == 0 for r in first)
    assert all(r["resumed"] > 1.7e9 and r["rstep"] == 6 for r in second)


def test_a_framework_resume_and_length_reach_the_step_records():
    # what the HF and Lightning callbacks report at the start of training (integrations/_common.py)
    from ranksight.integrations._common import run_length

    m = nn.Linear(4, 2)
    ranksight.watch(m, torch.optim.AdamW(m.parameters()), None, config=OFF)
    w = active()
    assert {k: w.step_state()[k] for k in ("resumed", "rstep", "total")} == {"resumed": 0, "rstep": 0, "total": 0}
    run_length(w, float("inf"), -1)  # unknown: an unbounded Lightning run, no step
    assert w.total_steps == 0 and w.resumes.last is None
    run_length(w, 1200, 400)
    st = w.step_state()
    assert st["total"] == 1200 and st["rstep"] == 400 and st["resumed"] >= int(time.time()) - 5
    run_length(w, 5000, 0)  # the first length stays (a declared one wins the same way)
    assert w.step_state()["total"] == 1200 and w.herr == 0
    ranksight.unwatch()
    ranksight.watch(m, torch.optim.AdamW(m.parameters()), None, config=OFF, total_steps=300)
    w = active()
    run_length(w, 1200, 0)
    w.set_total_steps("many")  # a bad value: one hook error, the value stays
    assert w.step_state()["total"] == 300 and w.herr == 1
    ranksight.unwatch()
