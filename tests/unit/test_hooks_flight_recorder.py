"""The Flight Recorder reader on recorded dump shapes (CPU: NCCL cannot run here; the real path
runs in tests/gpu/test_gpu_flight_recorder.py on the H200).

An entry shows "completed" as soon as its end event fires, while ``duration_ms`` appears only when
NCCL's watchdog retires it about 100 ms later (seen on the H200, 2026-11-29): the reader must count
the duration when it appears, once."""
from __future__ import annotations

import pickle
from typing import Any, Dict, Iterator, List

from ranksight.hooks.comm import FlightRecorder


def _reader(dumps: List[Dict[str, Any]]) -> FlightRecorder:
    fr = FlightRecorder.__new__(FlightRecorder)
    fr._seen = set()
    fr.errors = 0
    it: Iterator[Dict[str, Any]] = iter(dumps)
    fr._dump = lambda **kw: pickle.dumps(next(it))
    return fr


def _e(rid: int, state: str, d=None, created: int = 0) -> Dict[str, Any]:
    return {"pg_id": 0, "record_id": rid, "state": state, "duration_ms": d, "time_created_ns": created}


def test_duration_counted_when_it_appears_after_completion():
    fr = _reader([
        {"entries": [_e(1, "completed", None)]},  # end event fired, not retired yet
        {"entries": [_e(1, "completed", 2.5), _e(2, "completed", 1.0)]},
        {"entries": [_e(1, "completed", 2.5), _e(2, "completed", 1.0)]},  # nothing new
    ])
    assert fr.poll() == ([], -1.0)
    got, age = fr.poll()
    assert sorted(got) == [0.001, 0.0025] and age == -1.0
    assert fr.poll() == ([], -1.0)


def test_in_flight_collective_age():
    import time

    fr = _reader([{"entries": [_e(3, "started", created=time.time_ns() - 2_000_000_000)]}])
    got, age = fr.poll()
    assert got == [] and 1.5 < age < 60


def _coll(seq: int, op: str, created: int) -> Dict[str, Any]:
    # an entry as torch 2.13's gloo recorder dumps it (fields the reader uses)
    return {"pg_id": 0, "record_id": seq, "collective_seq_id": seq, "profiling_name": f"gloo:{op}",
            "process_group": ["0", "default_pg"], "is_p2p": False, "state": "scheduled",
            "time_created_ns": created}


def test_waiting_names_the_blocked_op_when_the_completed_count_lags():
    """gloo's completed count can stay behind while the rank is blocked: all_reduce #348-#351 read
    open though finished, and the rank is blocked in broadcast #352 (the wrappers see broadcast)."""
    import time

    t = time.time_ns() - 5_000_000_000
    dump = {"pg_status": {"0": {"last_enqueued_collective": 352, "last_completed_collective": 347}},
            "entries": [_coll(s, "all_reduce", t + s) for s in range(340, 352)] + [_coll(352, "broadcast", t + 352)]}
    fr = _reader([dump] * 3)
    assert fr.waiting("broadcast")["seq"] == 352 and fr.waiting("broadcast")["op"] == "broadcast"
    got = fr.waiting()  # not told: the oldest open collective, as the status has it
    assert (got["op"], got["pg"], got["seq"]) == ("all_reduce", "default_pg", 348) and got["wait"] > 4
