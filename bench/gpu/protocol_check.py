"""On a CUDA machine: protocol v2 end to end with the real NVML collector.

A real agent (in this process: real NVML GPU collector + ranks) and a CUDA training loop under
``ranksight.watch`` with ``torch.cuda.set_sync_debug_mode("error")`` after warm-up. After
``unwatch()`` the agent must still show the rank (lingering, finished) with its exact step count,
and ``ranksight_rank_gpu_info`` must join the rank to the GPU whose NVML UUID the CUDA device has.
Prints one JSON object; exit 1 when a check fails.
"""
from __future__ import annotations

import json
import socket
import sys
import time
import urllib.request

import torch

import ranksight
from ranksight import catalog as C
from ranksight.exporter.agent import Agent, AgentSettings
from ranksight.common.plumbing import free_port


def metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def main() -> int:
    from prometheus_client.parser import text_string_to_metric_families

    port, uport = free_port(), free_port(udp=True)
    agent = Agent(AgentSettings(node=socket.gethostname(), listen=f"127.0.0.1:{port}",
                                ingest=f"udp://127.0.0.1:{uport}", collectors=("gpu", "ranks")))
    agent.start()
    out = {"torch_uuid": str(torch.cuda.get_device_properties(0).uuid)}
    try:
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        data = [torch.randn(256, 1024, device="cuda") for _ in range(8)]
        n = 300
        errors = 0
        for i, _ in enumerate(ranksight.watch(model, opt, range(n), agent=f"udp://127.0.0.1:{uport}",
                                              config={"hooks": {"table_every_steps": 0, "table_every_seconds": 0}})):
            if i == 3:
                torch.cuda.set_sync_debug_mode("error")
            try:
                loss = model(data[i % 8]).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            except RuntimeError as e:
                errors += 1
                out.setdefault("sync_errors", []).append(str(e)[:200])
        torch.cuda.set_sync_debug_mode(0)
        ranksight.unwatch()
        time.sleep(1.5)
        fams = {f.name: f for f in text_string_to_metric_families(metrics(port))}
        samples = [s for f in fams.values() for s in f.samples]
        steps = [s.value for s in samples if s.name == C.STEPS.name]
        info = [s.labels for s in samples if s.name == C.RANK_GPU_INFO.name]
        gpus = [s.labels for s in samples if s.name == C.GPU_INFO.name]
        fin = [s.value for s in samples if s.name == C.RANK_FINISHED.name]
        fwd = [s.value for s in samples if s.name == C.FORWARD_SECONDS.name]
        out.update(steps=steps, rank_gpu_info=info, gpu_info=gpus, finished=fin, forward_seconds=fwd,
                   sync_error_count=errors)
        ok = (steps == [float(n)] and fin == [1.0] and len(info) == 1 and errors == 0
              and any(g["uuid"].lower() == info[0]["uuid"] and g["gpu"] == info[0]["gpu"] for g in gpus))
        out["ok"] = ok
    finally:
        agent.stop()
    print(json.dumps(out, indent=1))
    return 0 if out.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
