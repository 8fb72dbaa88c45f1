"""Which CUDA syncs are ranksight's (``bench/gpu/integrations.py``'s ``_ours``, used by the GPU
checks of the frameworks that synchronize on their own: the HF Trainer, Lightning, DeepSpeed):
the innermost frame that is not torch's or the standard library's decides. Fed the stacks sync
debug mode recorded on an H100 in DeepSpeed's ZeRO-2 and ZeRO-3 steps (tests/fixtures/gpu): each
runs inside a call the hooks wrap (the engine's step, the backward), and each is DeepSpeed's own
(its overflow check, its gradient norm, its partition epilogue)."""
from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "gpu"))

from integrations import _ours  # noqa: E402

RECORDED = json.loads((REPO / "tests" / "fixtures" / "gpu" / "deepspeed_syncs.json").read_text())
# where they were on the GPU machine
OURS = ("/work/main/hooks/", "/work/main/ranksight/integrations/")
LIBS = ("/opt/torch/.venv/lib/python3.12/site-packages/torch/", "/usr/lib/python3.12/")
TORCH_ITEM = "/opt/torch/.venv/lib/python3.12/site-packages/torch/_tensor.py:1 item"


def _stack(frames):
    out = []
    for f in frames:
        where, name = f.rsplit(" ", 1)
        path, line = where.rsplit(":", 1)
        out.append(traceback.FrameSummary(path, int(line), name))
    return out


@pytest.mark.parametrize("i", range(len(RECORDED["stacks"])))
def test_deepspeeds_own_syncs_inside_a_wrapped_call_are_not_ours(i):
    frames = RECORDED["stacks"][i]
    assert any(f.startswith(OURS) for f in frames)  # a hooks frame is on each of them
    assert not _ours(_stack(frames), OURS, LIBS)


@pytest.mark.parametrize("i", range(len(RECORDED["stacks"])))
def test_a_sync_the_hooks_make_is_ours_wherever_it_is(i):
    frames = RECORDED["stacks"][i]
    # the same stack, with a hooks frame that reads a tensor (through torch) at the innermost end
    ours = frames[:-1] + ["/work/main/hooks/loss.py:80 take", TORCH_ITEM, frames[-1]]
    assert _ours(_stack(ours), OURS, LIBS)
    # and a hooks frame called by the framework (a hook DeepSpeed runs) that syncs
    assert _ours(_stack(frames[:3] + ["/work/main/hooks/steppath.py:180 _fwd_post", frames[-1]]), OURS, LIBS)
