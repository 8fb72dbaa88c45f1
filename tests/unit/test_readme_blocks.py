"""Every ```python block of the README runs as written, in a fresh process on CPU.

A block is a fragment of a training script: ``CONTEXTS`` supplies what it needs around it (a tiny
model, an optimizer, a loader, a framework's trainer built from a config; nothing is downloaded),
matched by a line the block holds. The block's text goes into the script unchanged, between its
context's ``before`` and ``after``; ``after`` trains and checks that the block watched the steps.
``RANKSIGHT_AGENT=off``: nothing is sent. The contexts import neither ``ranksight`` nor its
integrations before the block does, so a block that only works after an import it does not show
fails here, as it would for a reader. A block that raises, or watches nothing, fails its test.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

import pytest

from test_readme import README

OK = "README-BLOCK-OK"

# The watch's closed steps, seen from the model's forward: the integrations start the watch
# themselves, so the context looks it up (``ranksight.hooks.current()``) once the block has run.
PROBE = """
import sys
seen = []
def probe(*_):
    hooks = sys.modules.get("ranksight.hooks")
    w = hooks.current() if hooks is not None else None
    seen.append(None if w is None else w.stats()["steps"])
"""

TINY_DATA = """
import torch
torch.manual_seed(0)
torch.set_num_threads(1)
data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
loader = torch.utils.data.DataLoader(data, batch_size=2)   # 4 steps
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""

PLAIN_LOOP = """
import ranksight.hooks
for x, y in loader:
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
w = ranksight.hooks.current()
assert w is not None, "no active watch after the block"
ranksight.unwatch()
assert w.stats()["steps"] == 4, w.stats()
"""

HF_OFFLINE = """
import os
for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ[k] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
"""


@dataclass
class Context:
    before: str
    after: str


CONTEXTS: Dict[str, Context] = {
    # "Two-line integration": a plain loop
    "loader = ranksight.watch(model, optimizer, loader)": Context(TINY_DATA, PLAIN_LOOP),
    # checkpoints, timed inside a watched loop
    "with ranksight.checkpoint_timer(path):": Context(
        TINY_DATA + """
import ranksight
loader = ranksight.watch(model, optimizer, loader)
writes = []
ranksight.hooks.current().add_checkpoint_observer(lambda src, obj, where: writes.append((src, where)))
path = "checkpoint.pt"
state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
def write_my_checkpoint(where):
    with open(where, "wb") as f:
        f.write(b"my format" * 1000)
""", """
ranksight.unwatch()
assert writes == [("timer", path), ("atomic_save", path)], writes
assert torch.load(path)["model"].keys() == state["model"].keys()
"""),
    "ranksight.integrations.transformers.RanksightCallback()": Context(
        HF_OFFLINE + PROBE + """
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
model.register_forward_hook(probe)
ids = torch.randint(0, 64, (6, 8))
train_dataset = [{"input_ids": x, "labels": x} for x in ids]
args = TrainingArguments(output_dir="out", max_steps=3, per_device_train_batch_size=2, save_strategy="no",
                         logging_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
                         dataloader_pin_memory=False)
""", """
assert trainer.state.global_step == 3, trainer.state.global_step
assert len(seen) == 3 and None not in seen and seen[-1] == 2, seen   # step 3 closes at train()'s end
assert ranksight.hooks.current() is None   # the callback unwatched at train()'s end
"""),
    "ranksight.integrations.lightning.RanksightCallback()": Context(
        PROBE + """
import torch
import lightning as L
torch.manual_seed(0)
torch.set_num_threads(1)

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

model = Tiny()
model.register_forward_hook(probe)
data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randn(8, 1))
train_loader = torch.utils.data.DataLoader(data, batch_size=2)   # 4 steps
""", """
assert trainer.global_step == 4, trainer.global_step
assert len(seen) == 4 and None not in seen and seen[-1] == 3, seen
assert ranksight.hooks.current() is None   # the callback unwatched at fit()'s end
"""),
    "ranksight.integrations.accelerate.watch()": Context(
        TINY_DATA + """
from accelerate import Accelerator
accelerator = Accelerator(cpu=True)
""", """
for x, y in loader:
    optimizer.zero_grad()
    accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
    optimizer.step()
w = ranksight.hooks.current()
assert w is not None, "no active watch after the block"
ranksight.unwatch()
assert w.stats()["steps"] == 4, w.stats()
"""),
}


def python_blocks() -> List[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), re.S | re.M)


def context_of(block: str) -> str:
    keys = [k for k in CONTEXTS if k in block]
    assert len(keys) == 1, f"a README python block matches {len(keys)} contexts, not 1 ({keys}):\n{block}"
    return keys[0]


def test_every_python_block_has_one_context_and_every_context_one_block():
    blocks = python_blocks()
    assert blocks, "the README has no python block"
    used = [context_of(b) for b in blocks]
    assert sorted(used) == sorted(CONTEXTS), f"contexts without a README block: {set(CONTEXTS) - set(used)}"


def script(block: str, key: str) -> str:
    ctx = CONTEXTS[key]
    return "\n".join([textwrap.dedent(ctx.before), "# ---- the README block, as written ----", block,
                      "# ---- end of the README block ----", textwrap.dedent(ctx.after), f"print({OK!r})", ""])


def run_block(block: str, key: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    (cwd / "readme_block.py").write_text(script(block, key))
    env = dict(os.environ, RANKSIGHT_AGENT="off", PYTHONUNBUFFERED="1")
    env.pop("RANKSIGHT_JOB", None)
    return subprocess.run([sys.executable, "readme_block.py"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow  # a process each, importing torch (and a framework): 3-6 s
@pytest.mark.parametrize("key", [pytest.param(k, id=re.sub(r"\W+", "-", k).strip("-")[:48]) for k in CONTEXTS])
def test_python_block_runs_as_written(key, tmp_path):
    block = next(b for b in python_blocks() if context_of(b) == key)
    p = run_block(block, key, tmp_path)
    assert p.returncode == 0 and OK in p.stdout, (f"exit {p.returncode}\n--- script\n{script(block, key)}"
                                                  f"\n--- stdout\n{p.stdout[-3000:]}\n--- stderr\n{p.stderr[-6000:]}")


@pytest.mark.slow
def test_a_block_that_raises_fails_its_run(tmp_path):
    key = "loader = ranksight.watch(model, optimizer, loader)"
    block = next(b for b in python_blocks() if context_of(b) == key).replace("ranksight.watch(", "ranksight.wach(")
    p = run_block(block, key, tmp_path)
    assert p.returncode != 0 and OK not in p.stdout, p.stdout
    assert "AttributeError: module 'ranksight' has no attribute 'wach'" in p.stderr, p.stderr[-2000:]
