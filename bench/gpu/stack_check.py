"""The stalled rank's stack on a GPU: three checks, printed as one JSON line.

1. ``sync_debug``: a watched bf16 MLP trains under ``torch.cuda.set_sync_debug_mode("error")``
   (after 3 warm-up steps) while the background thread reads the main thread's stack (a
   host wait of 2 s inside the loop triggers it, ``hooks.stack_after_seconds`` 0.5): no
   exception, no hook error, and a stack record naming the waiting frame.
2. ``host_wait``: the rank waits on the host (``time.sleep``) in ``wait_on_host()``.
3. ``kernel``: the rank launches a long kernel (``torch.cuda._sleep``) in ``launch_long_kernel()``
   and blocks on its result (``.item()``) in the same function.

The stack records are read from the hooks' own datagrams on a local UDP socket (no agent).
Run on the GPU machine: ``python bench/gpu/stack_check.py``.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from typing import Any, Dict, List


def main() -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.2)
    os.environ.update(RANKSIGHT_AGENT=f"udp://127.0.0.1:{sock.getsockname()[1]}", RANKSIGHT_JOB="stack-check",
                      RANKSIGHT__hooks__stack_after_seconds="0.5", RANKSIGHT__hooks__stack_every_seconds="0.5")
    stacks: List[Dict[str, Any]] = []
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            try:
                rec = json.loads(sock.recv(65536))
            except (socket.timeout, ValueError):
                continue
            if rec.get("t") == "stack" and rec.get("frames"):
                stacks.append(rec)

    threading.Thread(target=listen, daemon=True).start()
    import torch

    import ranksight

    dev = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).to(dev, torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ranksight.watch(model, opt)
    x = torch.randn(64, 1024, device=dev, dtype=torch.bfloat16)

    def step() -> None:
        model(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def wait_on_host() -> None:
        time.sleep(2.0)

    def launch_long_kernel() -> float:
        torch.cuda._sleep(int(3e9))  # about 2 s of GPU spin on an H200
        return torch.ones(1, device=dev).add_(1).item()

    out: Dict[str, Any] = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    errors: List[str] = []
    n = len(stacks)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(10):
            step()
            if i == 4:
                wait_on_host()
    except Exception as e:  # the check fails: report it
        errors.append(f"{type(e).__name__}: {e}")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    time.sleep(0.5)
    from ranksight.hooks import current

    herr = current().herr
    out["sync_debug"] = {"errors": errors, "stacks": [s["where"] for s in stacks[n:]], "hook_errors": herr}
    n = len(stacks)
    wait_on_host()
    time.sleep(0.3)
    out["host_wait"] = {"where": [s["where"] for s in stacks[n:]], "frames": stacks[n]["frames"][:4] if len(stacks) > n else []}
    n = len(stacks)
    t0 = time.perf_counter()
    launch_long_kernel()
    out["kernel"] = {"seconds": round(time.perf_counter() - t0, 2), "where": [s["where"] for s in stacks[n:]],
                     "frames": stacks[n]["frames"][:4] if len(stacks) > n else []}
    stop.set()
    ranksight.unwatch()
    print(json.dumps(out))
    ok = (not errors and not herr and any("wait_on_host" in s for s in out["sync_debug"]["stacks"])
          and any("wait_on_host" in s for s in out["host_wait"]["where"])
          and any("launch_long_kernel" in s for s in out["kernel"]["where"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
