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
