"""The lints' building blocks, in-process: checkpoint anatomy, batch digest, sysfs parsing, the
config switches (also through watch(config=...)), and the NUMA check on fake sysfs trees.
The lints themselves run on real 2-rank jobs in test_lints.py."""
from __future__ import annotations

import logging
import os
import random
import time

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

import ranksight  # noqa: E402
from ranksight.hooks import lints as L  # noqa: E402

OFF = {"hooks": {"agent": "off", "table_every_steps": 0, "table_every_seconds": 0}}


def _model():
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_checkpoint_anatomy_shapes():
    m = _model()
    opt = torch.optim.AdamW(m.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)
    sd = m.state_dict()
    # a bare state_dict and a module object: weights, nothing else
    for obj in (sd, m):
        a = L.checkpoint_anatomy(obj)
        assert a.weights and not a.parts
    full = {"model": sd, "optimizer": opt.state_dict(), "lr_scheduler": sched.state_dict(),
            "rng_states": {"cpu": torch.get_rng_state(), "cuda": [torch.zeros(16, dtype=torch.uint8)],
                           "python": random.getstate()},
            "train_state": {"epoch": 3, "global_step": 1200}}
    a = L.checkpoint_anatomy(full)
    assert a.weights and a.parts == set(L.PARTS_ORDER)
    # nested model dicts, optimizer/scheduler objects, a generator, a step tensor
    a = L.checkpoint_anatomy({"models": {"enc": sd, "dec": sd}, "opt": opt, "sched": sched,
                              "gen": torch.Generator(), "iteration": torch.tensor(5)})
    assert a.weights and a.parts == {L.OPTIMIZER, L.SCHEDULER, L.CPU_RNG, L.STEP}
    # the files of a split checkpoint, one at a time
    assert L.checkpoint_anatomy(opt.state_dict()).parts == {L.OPTIMIZER}
    assert L.checkpoint_anatomy(sched.state_dict()).parts == {L.SCHEDULER}
    hf_rng = {"python": random.getstate(), "cpu": torch.get_rng_state(), "cuda": [torch.zeros(16, dtype=torch.uint8)]}
    a = L.checkpoint_anatomy(hf_rng)
    assert not a.weights and a.parts == {L.CPU_RNG, L.CUDA_RNG}
    # a DCP Stateful wrapper: its content is not visible before the save calls it
    class App:
        def state_dict(self):
            return {}

        def load_state_dict(self, sd):
            pass

    a = L.checkpoint_anatomy({"model": sd, "app": App()})
    assert a.weights and a.opaque
    # not checkpoints
    assert L.checkpoint_anatomy([sd]) is None and L.checkpoint_anatomy(torch.zeros(3)) is None


def test_batch_digest():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(32, 3, 8, 8, generator=g), torch.randint(0, 10, (32,), generator=g)
    d = L.batch_digest((x, y))
    assert d == L.batch_digest((x.clone(), y.clone()))
    x2 = x.clone()
    x2[5, 0, 0, 0] += 1.0  # element 960: in the strided sample (every 6th of 6144)
    assert L.batch_digest((x2, y)) != d
    assert L.batch_digest({"input_ids": y, "text": ["a", "b"]}) != L.batch_digest({"input_ids": y, "text": ["a", "c"]})
    assert L.batch_digest(torch.empty(4, device="meta")) is None  # not on the CPU: would need a device copy
    assert L.batch_rows({"x": x}) == 32 and L.batch_rows(["no tensors"]) is None


def test_sysfs_helpers():
    assert L.cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert L.ranges({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert L.sysfs_bus_id("00000000:18:00.0") == "0000:18:00.0"
    assert L.sysfs_bus_id("0000:DC:00.0") == "0000:dc:00.0"


def test_settings_from_dict_path_env_and_bad_values(tmp_path, caplog):
    s = L.load_settings({"lints": {"numa_binding": False}, "thresholds": {"lint_min_free_bytes": 5}})
    assert not s.on("numa_binding") and s.on("io_amplification") and s.min_free_bytes == 5
    p = tmp_path / "c.yml"
    p.write_text("lints:\n  sampler_epoch: false\nthresholds:\n  lint_workers_host_mem_share: 0.25\n")
    s = L.load_settings(str(p))
    assert not s.on("sampler_epoch") and s.workers_host_mem_share == 0.25
    with caplog.at_level(logging.WARNING, logger="ranksight.hooks.lints"):
        s = L.load_settings({"lints": {"disk_headroom": "maybe"}, "thresholds": {"lint_workers_host_mem_share": 7}})
    assert s.on("disk_headroom") and s.workers_host_mem_share == 0.5
    assert len([r for r in caplog.records if "using the default" in r.getMessage()]) == 2


def test_watch_config_reaches_the_lints():
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    try:
        ranksight.watch(m, opt, [], config=dict(OFF, lints={k: False for k in L.LINT_IDS}))
        assert getattr(ranksight.hooks.current(), "lints", None) is None  # every lint off: nothing attached
        ranksight.watch(m, opt, [], config=dict(OFF, lints={"numa_binding": False}))
        lints = ranksight.hooks.current().lints
        assert not lints.on("numa_binding") and lints.on("io_amplification")
    finally:
        ranksight.unwatch()


def _tree(root, numa_node, cpus):
    bus = "0000:3b:00.0"
    os.makedirs(os.path.join(root, "bus/pci/devices", bus))
    with open(os.path.join(root, "bus/pci/devices", bus, "numa_node"), "w") as f:
        f.write(f"{numa_node}\n")
    if numa_node >= 0:
        os.makedirs(os.path.join(root, f"devices/system/node/node{numa_node}"))
        with open(os.path.join(root, f"devices/system/node/node{numa_node}/cpulist"), "w") as f:
            f.write(L.ranges(cpus) + "\n")
    return root, bus


def test_numa_check_on_fake_sysfs(tmp_path):
    aff = os.sched_getaffinity(0)
    m = _model()
    try:
        ranksight.watch(m, torch.optim.SGD(m.parameters(), lr=0.1), [], config=OFF)
        lints = ranksight.hooks.current().lints
        lints.check_numa(str(tmp_path / "none"), bus_id="0000:3b:00.0")  # missing files: quiet, nothing reported
        assert lints.state("numa_binding") is None
        root, bus = _tree(str(tmp_path / "same"), 0, aff)
        lints.check_numa(root, bus_id=bus)
        assert lints.state("numa_binding") == (False, "")
        root, bus = _tree(str(tmp_path / "other"), 1, {max(aff) + 1, max(aff) + 2})
        lints.check_numa(root, bus_id="00000000:3B:00.0")  # NVML's spelling
        active, msg = lints.state("numa_binding")
        assert active and f"excludes every CPU of NUMA node 1 ({max(aff) + 1}-{max(aff) + 2})" in msg
        root, bus = _tree(str(tmp_path / "flat"), -1, set())
        lints.check_numa(root, bus_id=bus)  # one NUMA node (-1): fine
        assert lints.state("numa_binding") == (False, "")
        assert lints.gpu_bus_id() is None  # CPU-only: no GPU in use, the automatic check stays quiet
    finally:
        ranksight.unwatch()


def test_final_save_is_judged_at_close(tmp_path):
    """A run that saves and ends right away (no next step, no lints tick): unwatch() judges the
    open checkpoint round and its lint record leaves with the watcher's final flush."""
    from lint_workloads.harness import Receiver

    rx = Receiver()
    try:
        m = _model()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        data = [(torch.randn(4, 4), torch.randn(4, 2)) for _ in range(3)]
        for x, y in ranksight.watch(m, opt, data, agent=rx.url, config={"hooks": {"table_every_steps": 0}}):
            ((m(x) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
        torch.save({"model": m.state_dict(), "optimizer": opt.state_dict(), "step": 3}, tmp_path / "last.pt")
        ranksight.unwatch()
        deadline = time.monotonic() + 5

        def judged() -> list:  # another lint may come first: wait for this one
            return [r for r in rx.records if r["t"] == "lint" and r["lint"] == "incomplete_checkpoint"]

        while not judged() and time.monotonic() < deadline:
            time.sleep(0.02)
        got = judged()
        assert got and got[-1]["active"] and "lacks: CPU RNG state, sampler/data position;" in got[-1]["msg"], got
        assert not rx.invalid
    finally:
        ranksight.unwatch()
        rx.close()


def test_lint_ids_are_written_once_and_each_has_its_module():
    """ranksight.catalog.LINT_IDS is the one list: the triage table describes exactly those, each
    id is registered by its own module of ranksight.hooks.lints, and no lint module types an id."""
    import re
    from pathlib import Path

    from ranksight import catalog, triage

    assert tuple(triage.LINTS) == catalog.LINT_IDS
    assert set(L.REGISTRY) == set(catalog.LINT_IDS)
    for lint_id, cls in L.REGISTRY.items():
        assert cls.__module__ == f"ranksight.hooks.lints.{lint_id}", (lint_id, cls.__module__)
    pkg = Path(L.__file__).parent
    ids = "|".join(catalog.LINT_IDS)
    for f in sorted(pkg.glob("*.py")):
        code = re.sub(r'"""[\s\S]*?"""', "", f.read_text())  # docstrings may name them
        assert not re.findall(rf"[\"']({ids})[\"']", code), f"{f.name} types a lint id: use ranksight.catalog"
