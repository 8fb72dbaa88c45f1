"""Model FLOPs per token (hooks/flops.py): declared, or 6·N (+ 12·L·H·T with a Hugging Face config)
from the watched model, checked against hand calculations; and what a real watch sends."""
from __future__ import annotations

import socket
import time

import pytest

torch = pytest.importorskip("torch")

import ranksight  # noqa: E402
from ranksight import protocol as P  # noqa: E402
from ranksight.hooks import flops  # noqa: E402

from test_hooks_batch import Raw  # noqa: E402

V, POS, L, H = 101, 32, 2, 64  # a small GPT-2: vocabulary, positions, layers, hidden size


def gpt2():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=V, n_positions=POS, n_layer=L, n_embd=H, n_head=4)
    return transformers.GPT2LMHeadModel(cfg)


def gpt2_params_by_hand() -> int:
    """GPT-2's parameters: token and position embeddings (the LM head shares the token one), per
    layer two LayerNorms (2·2H), attention c_attn (H·3H + 3H) and c_proj (H·H + H), MLP c_fc
    (H·4H + 4H) and c_proj (4H·H + H), and the final LayerNorm (2H)."""
    per_layer = 2 * 2 * H + (3 * H * H + 3 * H) + (H * H + H) + (4 * H * H + 4 * H) + (4 * H * H + H)
    assert per_layer == 12 * H * H + 13 * H
    return V * H + POS * H + L * per_layer + 2 * H


def test_a_gpt_like_hugging_face_model_gets_6n_plus_the_attention_term():
    m = gpt2()
    n = gpt2_params_by_hand()
    f = flops.FlopsPerToken(0, m)
    assert (f.source, f.params, f.layers, f.hidden) == (flops.ESTIMATE_6N_ATTN, n, L, H)
    assert f.value() == 6 * n  # before the first batch with tokens: no T yet
    t = 16
    assert f.value(t) == 6 * n + 12 * L * H * t
    assert f.value(999) == 6 * n + 12 * L * H * t, "computed once: the first T stays"
    assert f.info() == {"fpt_source": "estimate_6n_attn", "fpt_params": n, "fpt_layers": L, "fpt_hidden": H}


def test_frozen_parameters_are_not_counted_and_a_wrapper_counts_its_module():
    m = gpt2()
    m.transformer.wpe.weight.requires_grad_(False)
    n = gpt2_params_by_hand() - POS * H

    class Wrapper(torch.nn.Module):  # DDP's shape: the model under .module, no config of its own
        def __init__(self, module):
            super().__init__()
            self.module = module

    f = flops.FlopsPerToken(0, Wrapper(m))
    assert (f.source, f.params, f.layers, f.hidden) == (flops.ESTIMATE_6N_ATTN, n, L, H)


def test_a_model_without_a_config_gets_6n():
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    f = flops.FlopsPerToken(0, m)
    assert f.source == flops.ESTIMATE_6N
    assert f.value(128) == 6 * (16 * 32 + 32 + 32 * 8 + 8)


def test_a_declared_value_wins_and_no_model_is_unknown():
    f = flops.FlopsPerToken(1_234_567, gpt2())
    assert (f.source, f.value(16), f.params) == (flops.DECLARED, 1_234_567, 0)
    u = flops.FlopsPerToken(0, None)
    assert (u.source, u.value(16)) == (flops.UNKNOWN, 0)


def test_no_device_memory_is_read():
    """numel() and requires_grad only: a model on the meta device (no storage) counts the same."""
    with torch.device("meta"):
        m = gpt2()
    assert flops.FlopsPerToken(0, m).params == gpt2_params_by_hand()


@pytest.mark.parametrize("declared", [0, 5_000_000])
def test_a_watch_sends_the_value_in_every_steps_record_and_its_source_in_the_hello(clean_watch_env, declared):
    m = gpt2()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    raw = Raw()
    t = 8
    batches = [{"input_ids": torch.randint(0, V, (2, t))} for _ in range(3)]
    cfg = {"hooks": {"heartbeat_seconds": 0.2, "table_every_steps": 0, "table_every_seconds": 0,
                     "flops_per_token": declared}}
    for b in ranksight.watch(m, opt, batches, agent=raw.url, config=cfg):
        loss = m(**b, labels=b["input_ids"]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    ranksight.unwatch()
    recs = [P.decode(d) for d in raw.drain()]
    hello = next(r for r in recs if r["t"] == "hello")
    steps = [r for r in recs if r["t"] == "steps"]
    want = declared or 6 * gpt2_params_by_hand() + 12 * L * H * t
    assert steps and {r["fpt"] for r in steps} == {want}
    assert hello["info"]["fpt_source"] == ("declared" if declared else "estimate_6n_attn")


def first_hello(raw: Raw, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            rec = P.decode(raw.sock.recv(65536))
        except socket.timeout:
            continue
        if rec["t"] == "hello":
            return rec
    raise AssertionError(f"no hello in {timeout:g} s")


def test_a_model_found_after_watch_is_counted_once_it_is_known(clean_watch_env):
    """ranksight.watch() finds the model at its first optimizer step; the hello (sent at start)
    said "unknown", the step records carry 6·N once the model is known."""
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    raw = Raw()
    data = torch.utils.data.TensorDataset(torch.randn(24, 8, 16), torch.randint(0, 8, (24, 8)))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    cfg = {"hooks": {"heartbeat_seconds": 0.2, "table_every_steps": 0, "table_every_seconds": 0}}
    ranksight.watch(agent=raw.url, config=cfg)
    # the background thread sends the hello as it starts; the loop waits for it, so the model is
    # found after the hello went out (were the first step first, the hello would carry the count)
    hello = first_hello(raw)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(m(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    ranksight.unwatch()
    recs = [P.decode(d) for d in raw.drain()]
    assert hello["info"]["fpt_source"] == "unknown"
    fpt = [r["fpt"] for r in recs if r["t"] == "steps"]
    assert fpt and fpt[-1] == 6 * (16 * 32 + 32 + 32 * 8 + 8) and set(fpt) <= {0, fpt[-1]}
