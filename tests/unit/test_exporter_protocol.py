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
    rec.update({k: 0.001 * (i + 1) for i, k in enumerate(P.LAYOUTS[v].seconds)})
    if v >= 2:
        rec["sess"] = 99
    rec.update(over)
    return {k: x for k, x in rec.items() if x is not KeyError}


class fast_off:
    """decode()'s compiled fast check ``name`` ("step" or "tot") turned off, for every version."""

    def __init__(self, name: str, off: bool = True):
        self.name, self.off = name, off

    def __enter__(self):
        self.saved = {v: getattr(c, self.name) for v, c in P.CHECKS.items()}
        if self.off:
            for c in P.CHECKS.values():
                setattr(c, self.name, lambda rec: False)

    def __exit__(self, *exc):
        for v, c in P.CHECKS.items():
            setattr(c, self.name, self.saved[v])


def slow(data: bytes):
    """decode() with the fast path turned off."""
    with fast_off("step"):
        return verdict(data)


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
    assert P.decode(P.encode(rec)) == dict(rec, **P.LAYOUTS[1].missing)  # v1 carries no samples or tokens
    parsed = json.loads(P.encode(step(2)))
    assert P.CHECKS[2].step(parsed)


# --- "steps" records: the agent's decode (phases=False) cuts the phase lists out before parsing


def steps_bytes(n: int = 5, **over) -> bytes:
    """A "steps" record in the hooks' layout (hooks/sender.py): identity, ts, seq, the per-step
    lists in column order (9 significant digits here: longer numbers than the hooks' 6), micro,
    the last-step scalars, tot, hist."""
    head = {"v": 2, "job": "j", "ws": 4, "rank": 1, "lr": 1, "node": "n", "pid": 7, "sess": 99, "t": "steps",
            "ts": 1.7e9, "seq": 3}
    cols = {k: [0.0013 * (i + 1) * (j + 1) for j in range(n)] for i, k in enumerate(P.LAYOUTS[2].seconds)}
    cols["ckpt"] = [0.0] * n
    tail = {"micro": [1] * n, "retries": 0, "ooms": 0, "mres": 1 << 30, "malloc": 1 << 29, "herr": 0, "hdrop": 0,
            "wrss": 0, "restart": 0,
            "tot": {"steps": 10, "micro": 10, "dur": 0.5, "data": 0.01, "fwd": 0.1, "bwd": 0.2, "opt": 0.05,
                    "b2o": 0.3, "comm": 0.1, "xcomm": 0.01, "ckpt_s": 0.0, "ckpt_bytes": 0, "ckpt_n": 0,
                    "ckpt_fail": 0},
            "hist": {k: [0] * m for k, m in P.HIST_SIZES.items()}}
    for k, x in over.items():
        for part in (head, cols, tail):
            if k in part:
                part[k] = x
    lists = ",".join('"%s":[%s]' % (k, ",".join(v if isinstance(v, str) else "%.9g" % v for v in vals))
                     if isinstance(vals, list) else json.dumps({k: vals})[1:-1] for k, vals in cols.items())
    return ("%s,%s,%s" % (json.dumps(head, separators=(",", ":"))[:-1], lists,
                          json.dumps(tail, separators=(",", ":"), allow_nan=True)[1:])).encode()


def lists_off(res):
    """A decoded record without its phase lists (and the first values the cut keeps of them)."""
    return {k: x for k, x in res.items() if k not in P.PHASE_LISTS + ("first",)} if isinstance(res, dict) else res


def whole(data: bytes):
    """The full decode's verdict, less the phase lists the agent does not keep."""
    return lists_off(verdict(data))


def agent(data: bytes):
    """The agent's decode (the phase lists are not kept when the cut was taken)."""
    try:
        return lists_off(P.decode(data, phases=False))
    except P.ProtocolError as e:
        return (e.result, str(e))


def test_the_hooks_layout_takes_the_cut_and_gives_the_full_result_less_the_lists():
    data = steps_bytes(24)
    assert P._cut_phases(data) is not None
    full, cut = P.decode(data), P.decode(data, phases=False)
    assert set(full) - set(cut) == set(P.PHASE_LISTS) and set(cut) - set(full) == {"first"}
    assert lists_off(cut) == whole(data) and cut["n"] == 24 and cut["dur"] == full["dur"]
    assert cut["first"] == {k: full[k][0] for k in P.PHASE_LISTS}
    one = steps_bytes(1)  # a record of one step: its lists hold one number each
    assert P.decode(one, phases=False)["first"] == {k: P.decode(one)[k][0] for k in P.PHASE_LISTS}


CUT_VARIANTS = [
    {"fwd": ["-0.1"] * 5}, {"bwd": ["1e400"] * 5}, {"opt": ["NaN"] * 5}, {"data": ["1E-5"] * 5},
    {"comm": ["01"] * 5}, {"xcomm": ["1."] * 5}, {"b2o": [".5"] * 5}, {"fwd": ["1e+5"] * 5},
    {"fwd": ["123456.0"] * 5}, {"fwd": ["604800"] * 5}, {"fwd": ["99999.99"] * 5}, {"fwd": ["true"] * 5},
    {"fwd": ["null"] * 5}, {"fwd": ['"1"'] * 5}, {"fwd": ["[1]"] * 5}, {"fwd": [0.1] * 4}, {"fwd": [0.1] * 6},
    {"ckpt": ["0"] * 5}, {"ckpt": ["1e-400"] * 5}, {"dur": [0.1] * 4}, {"dur": ["-1"] * 5}, {"micro": [1] * 4},
    {"micro": [0] * 5}, {"t": "step"}, {"v": 1}, {"v": 3}, {"v": 99}, {"seq": 0}, {"tot": {}}, {"hist": {"step": [1]}},
    {"fwd": 0.1}, {"fwd": []},
]


@pytest.mark.parametrize("over", CUT_VARIANTS, ids=[json.dumps(o) for o in CUT_VARIANTS])
def test_the_cut_changes_no_verdict(over):
    data = steps_bytes(**over)
    assert agent(data) == whole(data)


def test_the_cut_is_not_taken_where_json_would_read_the_lists_otherwise():
    good = steps_bytes()
    # the same key again after the lists (JSON keeps the last), whitespace, another order, a nested object
    dup = good[:-1] + b',"fwd":[1,2]}'
    spaced = good.replace(b',"fwd":[', b', "fwd":[')
    # the lists in a nested object that has a "micro" of its own, right after them
    i = good.index(b',"data":[')
    j = good.index(b',"micro":[')
    nested = good[:i] + b',"x":{"a":1' + good[i:j] + b',"micro":[1]}' + good[j:]
    # JSON in UTF-16 whose "node" string holds the lists' ASCII bytes (they read as other
    # characters there): the bytes must not be cut as lists
    rec = {k: x for k, x in json.loads(good).items() if k not in P.PHASE_LISTS}
    head, tail = json.dumps(rec, separators=(",", ":")).split('"node":"n"')
    lists = b"".join(b',"%s":[%s]' % (k.encode(), b",".join([b"1"] * 5)) for k in P.PHASE_LISTS)
    if len(lists) % 2:  # even: the UTF-16 text after the cut stays aligned
        lists = lists.replace(b"[1,", b"[10,", 1)
    utf16 = (head + '"node":"').encode("utf-16-le") + lists + b',"micro":[' + ('"' + tail).encode("utf-16-le")
    assert whole(utf16)[0] == "rejected"
    for data in (dup, spaced, nested, b" " + good, good.replace(b'"job":"j"', b'"job":"{"'), utf16):
        assert agent(data) == whole(data), data
    assert P._cut_phases(utf16) is None


def test_the_cut_agrees_on_random_byte_edits():
    rnd = random.Random(7)
    good = steps_bytes(6)
    i, j = good.index(b',"data":['), good.index(b',"micro":[')
    chars = b'0123456789.,e-+E[]{}":a '
    took = 0
    for _ in range(3000):
        b = bytearray(good)
        for _ in range(rnd.randrange(1, 4)):
            k = rnd.randrange(i - 20, j + 20)
            op = rnd.random()
            if op < 0.6:
                b[k] = rnd.choice(chars)
            elif op < 0.8:
                b.insert(k, rnd.choice(chars))
            else:
                del b[k]
        data = bytes(b)
        took += P._cut_phases(data) is not None
        assert agent(data) == whole(data), data
    assert took > 300, "the edits should leave many records the cut still takes"


def test_a_huge_integer_is_a_rejection_not_an_exception():
    for data in (step(2, ts=10 ** 400), step(2, dur=10 ** 400)):
        raw = json.dumps(data).encode()
        assert verdict(raw)[0] == "rejected" and slow(raw)[0] == "rejected"
    rec = json.loads(steps_bytes())
    rec["tot"]["dur"] = 10 ** 400
    for phases in (True, False):
        with pytest.raises(P.ProtocolError):
            P.decode(json.dumps(rec).encode(), phases=phases)


TOT_VARIANTS = [
    {}, {"ckpt_s": 0}, {"steps": 1.0}, {"dur": -1.0}, {"dur": float("nan")}, {"dur": 1e11}, {"steps": True},
    {"lck": 1.7e9, "lckd": 2.5}, {"lck": 1.7e9}, {"lck": 17, "lckd": 2.5}, {"lck": 1.7e9, "lckd": -1.0},
    {"extra": 1, "other": 2}, {"ckpt_n": KeyError}, {"micro": KeyError, "x": 0}, {"xcomm": None},
    {"ckpt": 0.5}, {"ckpt": 0.5, "lck": 1.7e9, "lckd": 2.5}, {"ckpt": 0.5, "lck": 1.7e9}, {"ckpt": 0.5, "x": 1},
    {"ckpt": -1.0}, {"ckpt": 1}, {"ckpt": "0.5"}, {"ckpt": float("nan")}, {"ckpt": 0.5, "lck": 17, "lckd": 2.5},
    {"lck": 1.7e9, "x": 1}, {"ckpt": 0.5, "lckd": 2.5, "x": 1},
]


@pytest.mark.parametrize("over", TOT_VARIANTS, ids=[json.dumps(o, default=str) for o in TOT_VARIANTS])
def test_the_totals_fast_check_agrees_with_the_key_checks(over):
    rec = json.loads(steps_bytes())
    rec["tot"].update(over)
    rec["tot"] = {k: x for k, x in rec["tot"].items() if x is not KeyError}
    data = json.dumps(rec, allow_nan=True).encode()
    with fast_off("tot"):
        slow_res = verdict(data)
    assert verdict(data) == slow_res


@pytest.mark.parametrize("phases", [True, False])
def test_the_steps_checkpoint_total_is_optional(phases):
    """tot["ckpt"] (the steps' checkpoint time) is optional: present, it is kept, on the fast path
    and on the key checks alike; absent (hooks before it), it stays absent."""
    for fast in (True, False):
        with fast_off("tot", off=not fast):
            rec = json.loads(steps_bytes())
            rec["tot"].update(ckpt=0.25, ckpt_s=12.0, lck=1.7e9, lckd=12.0)
            assert P.decode(json.dumps(rec).encode(), phases=phases)["tot"]["ckpt"] == 0.25
            del rec["tot"]["ckpt"]
            assert "ckpt" not in P.decode(json.dumps(rec).encode(), phases=phases)["tot"]


def test_a_stall_ended_by_a_cut_steps_record_splits_like_the_full_record():
    """Goodput moves a stalled first step's data wait and exposed comm out of their categories; with
    the phase lists cut out it reads them from "first" and splits the same way."""
    from ranksight.exporter import goodput
    from ranksight.exporter.ranks import RankSettings, RankTable

    cols = {"data": [0.4, 0.001, 0.001, 0.001], "xcomm": [0.05, 0.0, 0.0, 0.0], "dur": [3.0, 0.01, 0.01, 0.01]}
    later = json.loads(steps_bytes(4))
    later.update(cols, seq=10)
    first_rec = json.loads(steps_bytes(4))
    order = list(first_rec)
    got = []
    for phases in (True, False):
        table = RankTable(RankSettings())
        assert table.apply(P.decode(steps_bytes(4), phases=phases), 100.0) == "ok"
        g = table.ranks[("j", 1)].gp
        g.gap = None  # running, then stalled from t=95 in the data phase
        g.stall_since, g.stall_kind = 95.0, goodput.DATA
        data = ("{%s}" % ",".join(json.dumps({k: later[k]}, separators=(",", ":"))[1:-1] for k in order)).encode()
        assert P._cut_phases(data) is not None
        assert table.apply(P.decode(data, phases=phases), 101.0) == "ok"
        got.append(dict(g.over))
    assert got[0] == got[1] and got[0][goodput.DATA] == pytest.approx(0.4), got
