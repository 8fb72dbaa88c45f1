"""Two GPU-timing rules of the hooks on the real GPU (bench/gpu/enqueue_and_close.py; their CPU checks, with a
stand-in for CUDA events, are in tests/integration/test_hooks.py):

* an async collective's start event is recorded after the call returned: on a host-bound step
  the host's enqueue time (the GPU idling) is not communication; a synchronous call still counts
  from before the call;
* ``Watcher.close()`` waits (bounded, ``query()`` only) for the last steps' GPU intervals and
  sends them: with the GPU several steps behind at ``unwatch()``, the records' phase sums match
  the script's own CUDA events around the same calls.
"""
from __future__ import annotations

from typing import Any, Dict

import pytest

from gpu_fixtures import gpu_results, run_script_once  # noqa: F401  (fixture; puts bench/gpu on sys.path)
import gpu_workload as W

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not W.cuda_available(), reason=W.NO_CUDA)]

_CACHE: Dict[str, Dict[str, Any]] = {}
ENQUEUE = 0.02  # bench/gpu/enqueue_and_close.py ENQUEUE


@pytest.fixture(scope="module")
def case(tmp_path_factory, gpu_results):
    d = tmp_path_factory.mktemp("enqueue_and_close")

    def run(name: str) -> Dict[str, Any]:
        return run_script_once(_CACHE, name, ["enqueue_and_close.py", name], d / f"{name}.json", gpu_results,
                               f"enqueue_and_close_{name}", 240)

    return run


def _common(r: Dict[str, Any]) -> None:
    assert r["invalid_datagrams"] == [], r["invalid_datagrams"]
    assert r["stats"]["herr"] == 0 and r["stats"]["gpu"] is True, r["stderr_tail"]
    assert r["records"] == 7, r  # 6 measured steps + the flush step
    # the slow enqueue really ran on every measured step (the step is host-bound by it)
    assert r["dur_per_step"] >= ENQUEUE, r


@pytest.mark.parametrize("name", ("enqueue_async", "enqueue_ddp"))
def test_async_comm_excludes_the_host_enqueue(case, name):
    r = case(name)
    _common(r)
    if name == "enqueue_ddp":
        assert r["stats"]["ddp_comm_hook"] is True
    # counting the enqueue would add 20 ms of comm to every step
    assert r["comm_per_step"] < ENQUEUE / 4, (
        f"{name}: comm {r['comm_per_step'] * 1e3:.3f} ms per step includes the {ENQUEUE * 1e3:.0f} ms enqueue")


def test_sync_comm_still_counts_from_before_the_call(case):
    r = case("enqueue_sync")
    _common(r)
    assert r["comm_per_step"] >= 0.9 * ENQUEUE and r["xcomm_per_step"] >= 0.9 * ENQUEUE, r


def test_close_sends_the_last_steps_gpu_times(case):
    r = case("close")
    assert r["sync_debug_errors"] == [], r["sync_debug_errors"][0]
    assert r["hook_errors"] == 0, r["stderr_tail"]
    assert r["invalid_datagrams"] == []
    assert r["records"] == r["steps"] and r["seqs"][-1] == r["steps"]
    assert r["pending_before_close"] > 0, "the GPU was not behind at unwatch(): the case proves nothing"
    assert r["pending_after_close"] == 0 and r["gpu_unsent"] == 0, r
    # no interval dropped: close() waited for every one (intervals released unreached count in hdrop)
    assert r["hdrop"] == 0 and r["qdrop"] == 0 and r["send_errors"] == 0, r
    assert r["close_gpu_wait_s"] < 5.0 + 0.25, r  # CLOSE_GPU_MAX: bounded
    for k in ("fwd", "bwd", "opt"):
        assert r["reference"][k] > 0 and r["rel_diff"][k] <= 0.05, (
            f"{k}: hooks {r['hooks'][k] * 1e3:.3f} ms vs own events {r['reference'][k] * 1e3:.3f} ms over "
            f"{r['steps']} steps")
