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
    fr._first_seen = {}
    fr._open = {}
    fr.full_dumps = 0
    it: Iterator[Dict[str, Any]] = iter(dumps)

    def dump(**kw):
        fr.full_dumps += bool(kw.get("includeCollectives"))
        return pickle.dumps(next(it))

    fr._dump = dump
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


def _coll(seq: int, op: str, created: int, retired: bool = True) -> Dict[str, Any]:
    # an entry as torch 2.13's gloo recorder dumps it (fields the reader uses): gloo leaves every
    # entry "scheduled" and sets retired once the collective finished
    return {"pg_id": 0, "record_id": seq, "collective_seq_id": seq, "profiling_name": f"gloo:{op}",
            "process_group": ["0", "default_pg"], "is_p2p": False, "state": "scheduled",
            "time_created_ns": created, "retired": retired}


def _status(enq: int, done: int) -> Dict[str, Any]:
    return {"pg_status": {"0": {"last_enqueued_collective": enq, "last_started_collective": -1,
                                "last_completed_collective": done}}}


def test_waiting_skips_finished_collectives_when_the_completed_count_lags():
    """gloo's completed count can stay behind while the rank is blocked: all_reduce #348-#351 read
    open by the status though their entries are retired; the rank is blocked in broadcast #352."""
    import time

    t = time.time_ns() - 5_000_000_000
    dump = dict(_status(352, 347), entries=[_coll(s, "all_reduce", t + s) for s in range(340, 352)]
                + [_coll(352, "broadcast", t + 352, retired=False)])
    fr = _reader([dump] * 3)
    assert fr.waiting("broadcast")["seq"] == 352 and fr.waiting("broadcast")["op"] == "broadcast"
    got = fr.waiting()  # not told: the oldest open collective
    assert (got["op"], got["pg"], got["seq"]) == ("broadcast", "default_pg", 352) and got["wait"] > 4


def test_finished_collective_behind_a_lagging_count_is_not_in_flight():
    """gloo wrote barrier #768's completion before all_reduce #767's: the status reads #768 open
    for good, while its entry is retired (seen on this CPU with torch 2.13). The heartbeat must
    report nothing in flight, and the full dump is read once for that candidate."""
    entries = [_coll(767, "all_reduce", 1), _coll(768, "barrier", 2)]
    status, full = _status(768, 767), dict(_status(768, 767), entries=entries)
    fr = _reader([status, status, full] + [status] * 5)
    ages = [fr.inflight_age(10.0 + i) for i in range(7)]
    assert ages == [-1.0] * 7 and fr.full_dumps == 1


def test_open_collective_reported_from_when_it_was_first_seen():
    """A collective still open at the next heartbeat is confirmed by its entry; its age counts
    from the first heartbeat that saw it. Once the status moves past it, nothing is in flight."""
    entries = [_coll(767, "all_reduce", 1), _coll(768, "all_reduce", 2, retired=False)]
    status, full = _status(768, 767), dict(_status(768, 767), entries=entries)
    fr = _reader([status, status, full, status, status, full, _status(768, 768)])
    assert fr.inflight_age(10.0) == -1.0  # first seen: not confirmed yet
    assert fr.inflight_age(10.5) == 0.5  # confirmed open
    assert fr.inflight_age(11.0) == 1.0  # re-confirmed only every CONFIRM_EVERY seconds
    assert fr.inflight_age(11.5) == 1.5 and fr.full_dumps == 2
    assert fr.inflight_age(12.0) == -1.0


def test_status_alone_when_the_recorder_keeps_no_entries():
    """A group whose entries the recorder does not keep: the status is taken at its word."""
    status, full = _status(5, 4), dict(_status(5, 4), entries=[])
    fr = _reader([status, status, full])
    assert fr.inflight_age(1.0) == -1.0 and fr.inflight_age(2.0) == 1.0
