"""decode()'s compiled fast path for "step" records gives what the field-by-field checks give:
the same dict for a record it takes, and a record it does not take is decided by those checks."""
import json
import random

import pytest

from ranksight import protocol as P

IDENT = {"job": "j", "ws": 4, "rank": 1, "lr": 1, "node": "n", "pid": 7, "ts": 1.7e9}


def step(v: int = 1, **over):
    rec = dict(IDENT, v=v, t="step", seq=3, micro=1, retries=0, ooms=0, mres=1 << 30, malloc=1 << 29, herr=0,
               hdrop=0, wrss=0, restart=0)
    rec.update({k: 0.001 * (i + 1) for i, k in enumerate(P.STEP_SECONDS_FIELDS)})
    if v >= 2:
        rec["sess"] = 99
    rec.update(over)
    return {k: x for k, x in rec.items() if x is not KeyError}


def slow(data: bytes):
    """decode() with the fast path turned off."""
    saved = P._step_fast
    P._step_fast = lambda rec, n: False
    try:
        return verdict(data)
    finally:
        P._step_fast = saved


def verdict(data: bytes):
    try:
        return P.decode(data)
    except P.ProtocolError as e:
        return (e.result, str(e))


VARIANTS = [
    {}, {"micro": 0}, {"seq": 0}, {"dur": 3}, {"dur": -0.1}, {"dur": float("nan")}, {"dur": float("inf")},
    {"data": True}, {"mres": 2.0}, {"herr": -1}, {"ooms": 1 << 63}, {"xcomm": P.MAX_SECONDS},
    {"xcomm": P.MAX_SECONDS * 2}, {"ckpt": KeyError}, {"wrss": KeyError}, {"extra": 1}, {"sess": -1},
    {"sess": "x"}, {"ts": 5}, {"rank": 4}, {"seq": None}, {"micro": [1]}, {"opt": {}},
]


@pytest.mark.parametrize("v", [1, 2])
@pytest.mark.parametrize("over", VARIANTS, ids=[json.dumps(o, default=str) for o in VARIANTS])
def test_fast_path_agrees_with_the_field_checks(v, over):
    data = json.dumps(step(v, **over), allow_nan=True).encode()
    assert verdict(data) == slow(data)


def test_fast_path_agrees_on_random_mutations():
    rnd = random.Random(4)
    values = [0, 1, -1, 0.5, 1e300, 2 ** 70, "1", True, None, [], {}, float("nan")]
    keys = list(step(2))
    for _ in range(2000):
        rec = step(rnd.choice([1, 2]))
        for _ in range(rnd.randrange(1, 3)):
            rec[rnd.choice(keys)] = rnd.choice(values)
        data = json.dumps(rec, allow_nan=True).encode()
        assert verdict(data) == slow(data)


def test_fast_path_is_taken_for_what_the_bench_sends():
    rec = step(1)
    assert P.decode(P.encode(rec)) == rec
    parsed = json.loads(P.encode(step(2)))
    assert P._step_fast(parsed, P._STEP_KEYS[2])
