"""GPU check of the lints (run by hand on a CUDA machine; prints one JSON line per case).

Two ranks share cuda:0 over gloo (one GPU is enough: the point is the CUDA code path, not NCCL).
Checked: the parameter digest at the first forward runs under
``torch.cuda.set_sync_debug_mode("error")`` (a synchronizing call would raise, be counted as a
hook error, and the comparison would never finish), it fires when rank 1 changed a weight after
the DDP wrap and stays quiet otherwise; the NUMA check reads the real sysfs for the GPU's PCI
bus id. Usage: python tests/lint_workloads/gpu_check.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from ranksight.common.plumbing import free_port


def rank_main(perturb: bool) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import ranksight

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 8)).to(dev).to(torch.bfloat16))
    if perturb and rank == 1:
        with torch.no_grad():
            model.module[2].weight.mul_(1.01)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(32, 256), torch.randn(32, 8)) for _ in range(6)]
    # debug mode "error" only around the lints' forward pre-hook of the first step
    model.register_forward_pre_hook(lambda m, a: torch.cuda.set_sync_debug_mode("error"))
    loader = ranksight.watch(model, opt, data)
    w = ranksight.hooks.current()
    lints = w.lints
    model.register_forward_pre_hook(lambda m, a: torch.cuda.set_sync_debug_mode("default"))
    for x, y in loader:
        x, y = x.to(dev, torch.bfloat16, non_blocking=True), y.to(dev, torch.bfloat16, non_blocking=True)
        loss = ((model(x) - y).float() ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    deadline = time.monotonic() + 20
    while not lints.idle() and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.barrier()
    bus = lints.gpu_bus_id()
    numa_path = f"/sys/bus/pci/devices/{bus}/numa_node"
    numa = open(numa_path).read().strip() if os.path.exists(numa_path) else "missing"
    out = {"rank": rank, "perturb": perturb, "herr": w.herr, "rank_disagreement": lints.state("rank_disagreement"),
           "numa_binding": lints.state("numa_binding"), "bus": bus, "numa_node_file": numa,
           "affinity": sorted(os.sched_getaffinity(0))[:64], "torch": torch.__version__}
    ranksight.unwatch()
    dist.barrier()
    dist.destroy_process_group()
    print("RESULT " + json.dumps(out), flush=True)


def launch(perturb: bool) -> list:
    port = free_port()
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), RANKSIGHT_AGENT="off", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank", "1" if perturb else "0"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    res = []
    for p in procs:
        so, se = p.communicate(timeout=180)
        line = [ln for ln in so.splitlines() if ln.startswith("RESULT ")]
        res.append(json.loads(line[0][7:]) if line else {"rc": p.returncode, "err": se[-3000:]})
    return res


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--rank":
        rank_main(sys.argv[2] == "1")
    else:
        ok = True
        for perturb in (True, False):
            for r in launch(perturb):
                print(json.dumps(r), flush=True)
                rd = r.get("rank_disagreement")
                ok &= r.get("herr") == 0 and rd is not None and rd[0] == perturb
        print("GPU CHECK", "OK" if ok else "FAILED", flush=True)
        sys.exit(0 if ok else 1)
