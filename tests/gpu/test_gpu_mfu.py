"""MFU of a GPT of known shape, three ways, on one GPU.

A Hugging Face GPT-2 small built from its config (12 layers, 768 hidden, 12 heads, 1,024 tokens a
sequence, nothing downloaded) trains in bf16 autocast, watched by the hooks and sending to a real
``ranksight exporter`` (GPU and ranks collectors), which a real Prometheus scrapes every second while
it evaluates the generated test-profile rules.

- ranksight's MFU is the recording rule ``rank:ranksight_mfu:ratio`` read from that Prometheus: the
  rank's tokens rate times the FLOPs per token the hooks estimated, over the peak the agent's table
  gives the GPU's NVML name.
- The hand calculation uses the same FLOPs per token, written out here from the model's config
  (6·N + 12·L·H·T), the tokens of a step, a step time from the host clock between two
  ``torch.cuda.synchronize()`` calls over the same steady steps, and the datasheet's dense BF16 peak.
  They agree within 5%.
- ``torch.utils.flop_counter.FlopCounterMode`` counts one forward and backward: its FLOPs per token
  are within 10% of the estimate. It counts matrix multiplies and attention (causal attention as
  dense, as the estimate does), not the element-wise work, and no recompute runs here.

The Prometheus binary: ``$RANKSIGHT_PROMETHEUS_BIN``, ``.devbin/prometheus`` or PATH (the GPU
machine has none: unpack ``.devbin/prometheus.xz`` there first, see the command in bench/RESULTS.md).
"""
from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from gpu_fixtures import gpu_results  # noqa: F401  (puts bench/gpu on sys.path)
import gpu_workload as W

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not W.cuda_available(), reason=W.NO_CUDA)]

REPO = Path(__file__).resolve().parents[2]
DENSE_BF16 = {"NVIDIA H100 80GB HBM3": 989e12, "NVIDIA H200": 989e12}  # datasheets' dense BF16
BATCH, SEQ = 8, 1024
WARM_STEPS = 10
RATE_WINDOW_S = 30.0  # the test profile's windows.rate
SETTLE_S = 8.0  # records batched by the sender, a 1 s scrape, a 1 s rule evaluation


def _prometheus_binary() -> str:
    for c in (os.environ.get("RANKSIGHT_PROMETHEUS_BIN"), str(REPO / ".devbin" / "prometheus"),
              shutil.which("prometheus")):
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    pytest.fail("no Prometheus binary: unpack .devbin/prometheus.xz or set RANKSIGHT_PROMETHEUS_BIN")


def _start_prometheus(out: Path, target: str):
    from ranksight.tools.stack_files import rules_prometheus

    server = rules_prometheus(out / "prometheus", [target], binary=_prometheus_binary()).start()
    server.wait_ready(30.0)
    return server


def _gpt(dev):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=SEQ, vocab_size=50257)
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg).to(dev), cfg


def _hand_flops_per_token(model, cfg) -> int:
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return 6 * n + 12 * cfg.n_layer * cfg.n_embd * SEQ


def test_mfu_agrees_with_hand_calculation_and_flop_counter(tmp_path, gpu_results, monkeypatch):
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    import ranksight
    from ranksight.common.plumbing import PrometheusAPI
    from ranksight.tools.stack import AgentProcess
    from ranksight.triage.names import REC

    dev = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(dev)
    if name not in DENSE_BF16:
        pytest.skip(f"no datasheet figure written here for {name!r}")
    agent = AgentProcess(tmp_path / "agent", collectors="gpu,ranks", args=("--profile", "test"), name="agent-mfu")
    agent.start(timeout=60)
    prom = None
    try:
        prom = _start_prometheus(tmp_path, agent.target)
        model, cfg = _gpt(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ), device=dev)
        batch = {"input_ids": ids, "labels": ids}
        loader = [batch] * 100000
        for k in ("RANKSIGHT_AGENT", "RANKSIGHT_CONFIG"):
            monkeypatch.delenv(k, raising=False)
        monkeypatch.setenv("RANKSIGHT_JOB", "mfu-gpu")
        watched = ranksight.watch(model, opt, loader, agent=agent.ingest,
                                  config={"hooks": {"table_every_steps": 0, "table_every_seconds": 0}})

        def step(b):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(**b).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        got = {}
        stop = threading.Event()
        api = PrometheusAPI(prom.url)
        try:
            it = iter(watched)
            for _ in range(WARM_STEPS):
                step(next(it))
            torch.cuda.synchronize()
            t0, n = time.perf_counter(), 0
            while time.perf_counter() - t0 < RATE_WINDOW_S + SETTLE_S:
                step(next(it))
                n += 1
            torch.cuda.synchronize()
            t1 = time.perf_counter()

            def query() -> None:
                try:
                    time.sleep(SETTLE_S / 2)
                    got["mfu"] = api.query(f'{REC["mfu"]}{{job="mfu-gpu"}}')
                    got["fpt"] = api.query('ranksight_model_flops_per_token{job="mfu-gpu"}')
                except Exception as e:  # the assertion below names it
                    got["error"] = repr(e)
                finally:
                    stop.set()

            threading.Thread(target=query, daemon=True).start()
            while not stop.is_set():  # the rate window stays steady until the query has read it
                step(next(it))
        finally:
            ranksight.unwatch()
        step_s = (t1 - t0) / n
        fpt_hand = _hand_flops_per_token(model, cfg)
        peak = DENSE_BF16[name]
        mfu_hand = fpt_hand * BATCH * SEQ / step_s / peak

        flops = FlopCounterMode(display=False)
        with flops:
            step(batch)
        fpt_counted = flops.get_total_flops() / (BATCH * SEQ)

        assert "error" not in got, got.get("error")
        assert got["mfu"], f"no {REC['mfu']} series in Prometheus"
        mfu = float(got["mfu"][0]["value"][1])
        fpt = float(got["fpt"][0]["value"][1])
        gpu_results["mfu_gpt2_small"] = {
            "gpu": name, "step_ms": step_s * 1e3, "steps": n, "fpt_ranksight": fpt, "fpt_hand": fpt_hand,
            "fpt_flop_counter": fpt_counted, "mfu_ranksight": mfu, "mfu_hand": mfu_hand}
        print(gpu_results["mfu_gpt2_small"])
        assert fpt == fpt_hand, "the hooks' estimate is 6N + 12LHT of the same model"
        assert mfu == pytest.approx(mfu_hand, rel=0.05)
        assert fpt_counted == pytest.approx(fpt_hand, rel=0.10)
    finally:
        if prom is not None:
            prom.stop()
        agent.stop()
