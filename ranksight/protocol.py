"""The hooks -> agent datagram format (version 5; the agent also reads versions 1 to 4).
Torch-free; shared by both sides.

One datagram is one compact JSON object (UTF-8), at most ``MAX_DATAGRAM`` bytes.
Every record carries the identity fields; ``t`` selects the record type:

identity (all records)
  v       int   protocol version: 5 (hooks send this unless hooks.protocol says 2 to 4); 1 to 4
                are still accepted (see "Versions" below)
  t       str   "step" | "hb" | "bye" | "hello" | "ckpt" | "lint" | "stack"
  job     str   job name (<= 128 chars)
  rank    int   global rank, 0 <= rank < ws
  lr      int   local rank, 0 <= lr < 4096
  ws      int   world size, 1 <= ws <= MAX_WORLD
  node    str   hostname (<= 128 chars)
  pid     int   rank process id
  ts      float sender wall clock (unix seconds) when the record was made
  sess    int   (v2) watch session: random per ``watch()``, so that two watches in one process
                (a notebook, a Trainer calling train() twice) are told apart like two processes

"step"  one per optimizer step: ``seq`` int, the optimizer step number (1-based, monotone per
        process), and the step record's fields as ``ranksight/record.py`` declares them (key, type,
        unit, per step / cumulative / current, the versions carrying each). Per-step seconds on
        CUDA (fwd, bwd, opt, comm, xcomm) come from events resolved late, so they may belong to an
        earlier step; sums stay right. A field the record's version does not carry reads as 0.

"steps" (v2) consecutive optimizer steps in one datagram: what the hooks send (a tick's steps,
        as many as fit in one datagram, instead of one per step)
  seq     int   the first step's number; the others follow (seq+1, ...)
  ts      float (identity field) when the last of them ended
  per-step fields   [float or int, ...]  per step, as in "step"; all lists have the same length
                    n, 1 <= n <= STEPS_MAX. v3: only "dur" always; the others (the fields
                    record.py marks ``detail``) are step detail: all of them or none, sent when
                    the hooks are asked for it (hooks.step_detail); their sums are in "tot"
  first   object (v3) the first step's value of each field record.py marks ``first`` ("data",
                    "xcomm", "ckpt": the agent splits a stalled step with them), seconds
  cumulative and current fields   int  as in "step", at the last step
  tot, hist   the session's totals after the last of these steps (as in "hb"; required)

"hb"    heartbeat, every ``hb_interval`` seconds from a background thread
  tot     object (v2, optional) the watch session's cumulative totals, see TOTALS below
  hist    object (v2) the session's cumulative histogram bucket counts, see HISTS below
  seq     int   heartbeat counter
  every   float the sender's heartbeat interval (seconds)
  step    int   last completed optimizer step
  phase   str   "data"|"forward"|"backward"|"optimizer"|"checkpoint"|"other"|"idle"
  coll    float seconds since the oldest in-flight collective was launched; -1 = none in flight
  probe   float seconds since the main thread last made visible progress (liveness probe)
  pdur    float seconds the rank has been in its current phase (optional, default 0)
  herr    int   cumulative hook errors

"ckpt"  one per checkpoint write
  dur float, bytes int, ok bool (False: the write raised), src str ("torch.save"|"dcp"|"timer"|"atomic_save")

"lint"  a setup lint changed state
  lint str (a lint id), active bool, msg str (<= 512 chars)
  gbatch int, lrate float  (optional, lint "global_batch_lr" only) the global batch size and the
          base learning rate (param group 0's initial_lr, else lr). The agent remembers them per
          job across restarts and raises the lint itself when the global batch changed but the
          LR did not (an elastic resize or a new world size with the old LR); the sender's
          `active` is ignored for this lint.

"stack" the main thread's Python stack, sent by the background thread once the rank has made no
        progress for ``hooks.stack_after_seconds``; again when it changes (at most every
        ``hooks.stack_every_seconds``); one empty record when the rank makes progress again
  frames  [str] innermost first, "file:line function" (<= MAX_STACK_FRAMES entries of
          <= MAX_STACK_FRAME chars; the sender drops outer frames to fit STACK_DATAGRAM)
  where   str   the innermost frame outside the standard library, torch and ranksight, with the
          call on its line: "train.py:53 in load_batch <- time.sleep" (<= MAX_STACK_WHERE chars)
  idle    float seconds without progress when the stack was read
  phase   str   the rank's phase (PHASES)
  cw      object (optional) the collective the rank waits in, when it has one open:
          {"op": str (<= 64, "all_reduce"), "pg": str (<= 128, the group's name, "default_pg"),
           "seq": int (its sequence number in that group), "wait": float (seconds since launch)}

"hello" once at start: the self-check; again once the rank knows its model's parallelism
  info  object (<= 1 level; GPU names, CUDA/NCCL versions, dirs' free bytes, "strategy", "zero_stage")
  dirs  object {"tmp": path, "log": path, "checkpoint": path} (paths may be "")

"bye"   clean exit. v2: carries the final ``tot`` and ``hist`` (as "hb"); the agent keeps the rank's final series
        for ``agent.rank_linger_seconds``, marked finished (no misses, no down), then forgets it (v1: at once).

"hello" (v2) also carries:
  pstart  float process start time (unix seconds; startup = first step - this)
  gpu     str   the CUDA device's UUID as NVML prints it ("GPU-…"), "" without CUDA
  gpu_every int (optional) steps per CUDA-timed step (hooks.gpu_timing_every; 0 or absent: none)

Totals (v2). The sender keeps cumulative totals of everything it sent since ``watch()``: the
background thread adds each step and checkpoint record to them as it sends it, and every
heartbeat and the bye carry them. The agent exposes the latest totals (plus the step records
that arrived after them), so a lost datagram or an agent restart costs no count: the next
heartbeat brings the true values back.

  tot: "steps" int and the sum of each per-step field of the step record under its key
        (record.py), but "ckpt", which is optional (the time saves blocked the steps; an async
        save's background write is in "ckpt_s" but not here; without it the agent counts the checkpoint
        records' seconds); "ckpt_s" float, "ckpt_bytes", "ckpt_n", "ckpt_fail" int (checkpoint records:
        seconds, bytes of the successful ones, count, failures); "lck", "lckd" float (optional: unix
        time and duration of the last successful checkpoint)
  hist: [int, ...] non-cumulative bucket counts, +Inf last (len = buckets + 1), of each per-step field the
        record declares a histogram for (its "hist" key: "step", "data", "b2o") and of "ckpt" records' seconds

Versions. Node agents and training images upgrade on their own schedules. The agent accepts every version in
``ACCEPTED``: version 1 records have the old meaning (step records are deltas the agent sums; "bye" forgets the rank
at once); version 2 "steps" records carry every per-step list, version 3 ones only "dur" and "first" unless asked for
step detail; version 4 adds the step's work ("samples", "tokens") and the training loss ("loss", "lossn": their sums
in the totals, their lists as step detail; "lnan", "lnanstep": the non-finite losses and the first one's step); 5 the
CUDA allocator's peaks ("mpeak", "mrpeak"), a pipeline stage's ("pbusy", "pstep", "pwprev", "pwnext" per step, step
detail; "pstage", "pstages", "pmb" at the last step), a restore ("resumed", "rstep": its time, step) and the run's
length ("total"); other records are the same in 2 to 5. An unknown version is rejected and logged once: the hooks send
``hooks.protocol`` (``SENDABLE``: 5, or 4, 3, 2 for older agents).
"""
from __future__ import annotations

import json
import re
from operator import itemgetter
from typing import Any, Dict, Optional, Tuple

from ranksight import catalog as C
from ranksight import record

VERSION = 5  # what the hooks send by default
ACCEPTED = (1, 2, 3, 4, 5)  # what the agent reads
SENDABLE = (2, 3, 4, 5)  # what the hooks can be set to send (hooks.protocol)
CUT_VERSION = 2  # the version whose "steps" records the agent's decode cuts the phase lists out of
MAX_DATAGRAM = 4096  # bytes; larger is "oversize"
STEPS_MAX = 64  # steps in one "steps" record
# How the hooks send "steps" records (a sender's choice; the agent reads any): each background
# tick's steps in records of as many as one datagram holds (a record's identity and totals cost
# the agent as much as 25 steps' values), each step's values with STEP_DIGITS significant digits
# (the totals are summed unrounded). Steps never wait past their tick: a rank killed with
# SIGKILL loses at most one tick of them.
STEP_DIGITS = record.STEP_DIGITS
STEPS_FILL_BYTES = MAX_DATAGRAM * 15 // 16  # a full "steps" datagram, with room for values of more digits
STEPS_FILL_FIRST = 24  # steps a sender puts in its first record, before steps_fill() measured one
MAX_WORLD = 1 << 20
MAX_STR = 128
MAX_MSG = 512
MAX_SECONDS = 7 * 24 * 3600.0  # no single duration is longer than a week
MAX_BYTES = 1 << 60
MAX_COUNT = 1 << 62

TYPES = ("step", "steps", "hb", "bye", "hello", "ckpt", "lint", "stack")
MAX_STACK_FRAMES = 24
MAX_STACK_FRAME = 160
MAX_STACK_WHERE = 120
STACK_DATAGRAM = 2048  # a "stack" record's size budget, under MAX_DATAGRAM: agents built with a 2048-byte limit take it too
PHASES = ("data", "forward", "backward", "optimizer", "checkpoint", "other", "idle")
CKPT_SOURCES = ("torch.save", "dcp", "timer", "atomic_save")


def steps_fill(size: int, fixed: int, n: int) -> int:
    """How many steps one "steps" datagram holds, from a record of ``n`` steps and ``size`` bytes
    of which ``fixed`` are not per step (identity, scalars, totals): 1..STEPS_MAX."""
    per_step = max((size - fixed) / n, 1.0)
    return max(1, min(STEPS_MAX, int((STEPS_FILL_BYTES - fixed) // per_step)))


# The step record of each version, from its one declaration (ranksight/record.py).
LAYOUTS: Dict[int, record.Layout] = record.layouts(ACCEPTED)
# the hooks' encoder of each version they can send, with and without step detail
SENDER_LAYOUTS: Dict[Tuple[int, bool], record.Layout] = {
    (v, d): LAYOUTS[v] if d else record.Layout(record.FIELDS, v, detail=False)
    for v in SENDABLE for d in (True, False)}
STEP_SECONDS_FIELDS = LAYOUTS[VERSION].seconds  # per-step floats (seconds, the loss sum), in the order the hooks write them
STEP_COUNT_FIELDS = ("seq",) + LAYOUTS[VERSION].counts + LAYOUTS[VERSION].last
STEPS_LAST_FIELDS = LAYOUTS[VERSION].last  # one value per "steps" record, at its last step


# Totals (v2): the integer and float keys of "tot" (the per-step fields' sums, "steps" and the
# checkpoint records' totals), and the histograms of "hist" with their bucket counts.
TOTAL_STEP_CKPT = "ckpt"  # optional total: the sum of the steps' checkpoint time (see Totals above)
CKPT_HIST = ("ckpt", C.CHECKPOINT_WRITE, "ckpt_s")  # the checkpoint records' histogram: ("hist" key, metric, its sum)
MAX_TOTAL_SECONDS = 1e10  # a cumulative sum over a long job (a week's MAX_SECONDS is per step)


class ProtocolError(Exception):
    """A datagram the agent must drop. ``result`` is the ingest counter label."""

    def __init__(self, result: str, why: str, version: Any = None):
        super().__init__(why)
        self.result = result  # catalog.INGEST_MALFORMED | INGEST_OVERSIZE | INGEST_REJECTED
        self.version = version  # set when the reason is an unknown protocol version


def encode(rec: Dict[str, Any]) -> bytes:
    return json.dumps(rec, separators=(",", ":"), allow_nan=False).encode()


def _str(rec: Dict[str, Any], k: str, limit: int = MAX_STR, choices=None) -> str:
    v = rec.get(k)
    if not isinstance(v, str) or len(v) > limit or (choices is not None and v not in choices):
        raise ProtocolError(C.INGEST_REJECTED, f"bad {k}")
    return v


def _int(rec: Dict[str, Any], k: str, lo: int, hi: int) -> int:
    v = rec.get(k)
    if type(v) is not int or not (lo <= v <= hi):
        raise ProtocolError(C.INGEST_REJECTED, f"bad {k}")
    return v


def _secs(rec: Dict[str, Any], k: str, lo: float = 0.0, hi: float = MAX_SECONDS, default: Optional[float] = 0.0) -> float:
    v = rec.get(k, default)
    # the range alone: NaN and the infinities fail it, and an int of any size compares exactly
    # (math.isfinite would raise OverflowError for one too large for a float)
    if v is None or type(v) not in (int, float) or not (lo <= v <= hi):
        raise ProtocolError(C.INGEST_REJECTED, f"bad {k}")
    return float(v)


def _bool(rec: Dict[str, Any], k: str) -> bool:
    v = rec.get(k)
    if type(v) is not bool:
        raise ProtocolError(C.INGEST_REJECTED, f"bad {k}")
    return v


_SCAN = json.JSONDecoder().scan_once  # the C scanner that json.loads ends up in


def _parse(data: bytes) -> Any:
    """json.loads(data), minus its encoding detection and whitespace regexes (~20% of its time)
    when the datagram is plain UTF-8 JSON with nothing around the value, as encode() makes it.
    Anything else goes to json.loads itself, so the result (or the exception) never differs."""
    try:
        s = data.decode()
        obj, end = _SCAN(s, 0)
        if end == len(s):
            return obj
    except (ValueError, StopIteration, RecursionError, AttributeError):
        pass
    return json.loads(data)


# The "step" record's schema, compiled once into one function of straight-line checks (no loop,
# no call per field): it takes a parsed record that has every step field, with the usual types
# (floats for seconds, ints for counts), in range and nothing else, and then the parsed dict itself
# is decode()'s result. Anything it does not take (a missing field, an int where a float is usual,
# NaN, an extra key) goes through the field-by-field checks below, which accept or reject it, with
# their reason, as always; so the fast path changes no verdict, only the cost of the common one.
class Checks:
    """A version's step record checks, compiled once from its layout: ``step(rec)`` (a "step"
    record with every field it carries, and nothing else), ``tot(tot)`` (the totals as the hooks
    send them), the keys of "tot" and the sizes of "hist"."""

    def __init__(self, layout: record.Layout):
        self.layout = layout
        ints = ("seq",) + layout.counts + layout.last
        # keys of a "step" record with every field present: identity (with "v"), "sess" from v2 on, the fields
        n = (10 if layout.version >= 2 else 9) + len(layout.seconds) + len(ints)
        least = "".join(f"    if _{k} < {m}:\n        rec[{k!r}] = {m}\n" for k, m in layout.least.items())
        fill = f"    rec.update({layout.missing!r})\n" if layout.missing else ""
        self.step = record.compile_check("_step_fast", "rec", layout.seconds, MAX_SECONDS, ints, MAX_COUNT,
                                         f"    if len(rec) != {n}:\n        return False\n",
                                         "    if _seq < 1:\n        return False\n" + least + fill + "    return True\n")
        # the integer and the float keys every "tot" carries; "hist" key -> buckets + the +Inf bucket
        self.tot_ints = ("steps",) + layout.counts + ("ckpt_bytes", "ckpt_n", "ckpt_fail")
        self.tot_secs = tuple(k for k in layout.seconds if k != TOTAL_STEP_CKPT) + ("ckpt_s",)
        self.tot = _compile_totals_check(self.tot_ints, self.tot_secs)
        self.hist_sizes = {k: len(m.buckets) + 1 for k, m, _ in layout.hists + (CKPT_HIST,)}
        # a "steps" record's (seconds lists, count lists): with step detail, and without it
        self.lists = (layout.seconds, layout.counts)
        self.lists_required = tuple(tuple(k for k in ks if k not in layout.detail) for ks in self.lists)


_IDENT = itemgetter("t", "job", "ws", "rank", "lr", "node", "pid", "ts")  # the identity fields in one lookup


# A "steps" record's per-step phase lists (every per-step list but dur and micro) make up most of
# its bytes, and the agent keeps none of them: its counters come from the totals the record
# carries. decode(..., phases=False) checks them without turning them into floats: one regular
# expression over the record's bytes matches the lists in the order the hooks write them, each
# number in a grammar narrower than JSON's (no sign, no leading zero, below 100000, an exponent
# only negative: a number it matches is one the field checks accept), and they are cut out before
# the JSON parse. The cut is taken only when everything else says the lists sat in the top-level
# object of a v2 "steps" record (the only "{" before them is the first byte; none of their keys
# is left after the cut; each list has as many numbers as "dur"). Anything else is parsed and
# checked whole, so the cut changes no verdict and no reason, only the cost of the common record.
PHASE_LISTS = LAYOUTS[CUT_VERSION].seconds[1:]
_AFTER_PHASES = LAYOUTS[CUT_VERSION].counts[0]  # the list the hooks write after them


def _phase_cut(possessive: bool) -> "re.Pattern[bytes]":
    """The phase lists' pattern. Possessive quantifiers (Python 3.11 and newer) save the matcher
    its backtracking bookkeeping, about half its time; the grammar reads each number one way
    only, so the greedy form (older Pythons) matches the same bytes."""
    p = b"+" if possessive else b""
    num = rb"(?:0|[1-9][0-9]{0,4}" + p + rb")(?:\.[0-9]+" + p + rb")?" + p + rb"(?:e-[0-9]{1,3}" + p + rb")?" + p
    return re.compile(b"".join(b',"' + k.encode() + rb'":\[(' + num + rb"(?:," + num + rb")*" + p + rb")\]"
                               for k in PHASE_LISTS) + rb'(?=,"' + _AFTER_PHASES.encode() + rb'":\[)')


try:
    _PHASE_CUT = _phase_cut(True)
except re.error:  # before Python 3.11
    _PHASE_CUT = _phase_cut(False)
_PHASE_START = b',"' + PHASE_LISTS[0].encode() + b'":['
_NUMERIC = frozenset((int, float))
_INTEGER = frozenset((int,))


def _seconds_list(vals: Any, n: int) -> bool:
    """``vals`` is a list of ``n`` ints or floats, each in [0, MAX_SECONDS] (NaN fails): the
    element-wise check, done by C loops (``min``, ``max`` and ``sum`` see every element)."""
    if type(vals) is not list or len(vals) != n or not set(map(type, vals)) <= _NUMERIC:
        return False
    if not (0 <= min(vals) and max(vals) <= MAX_SECONDS):  # (first: no huge int reaches the float sum)
        return False
    s = sum(vals)
    return s == s  # a NaN anywhere makes the sum NaN


def _count_list(vals: Any, n: int) -> bool:
    """``vals`` is a list of ``n`` (>= 1) ints (not bools), each in [0, MAX_COUNT]."""
    return (type(vals) is list and len(vals) == n and set(map(type, vals)) <= _INTEGER
            and 0 <= min(vals) and max(vals) <= MAX_COUNT)


def _cut_phases(data: bytes) -> Optional[Dict[str, Any]]:
    """A v2 "steps" record parsed without its phase lists, which are valid, and with the first
    step's value of each under "first" (goodput splits a stall's first step with them); None when
    the cut does not apply (see above). The record must start as encode() writes it, ``{"``: the
    expression reads bytes, and JSON's other encodings (UTF-16, UTF-32) are left to the parse."""
    i = data.find(_PHASE_START)
    if i < 0 or data[:2] != b'{"' or data.count(b"{", 0, i) != 1:
        return None
    m = _PHASE_CUT.match(data, i)
    if m is None:
        return None
    try:
        rec = _parse(data[:i] + data[m.end():])
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if type(rec) is not dict or rec.get("t") != "steps" or rec.get("v") != CUT_VERSION:
        return None
    durs = rec.get("dur")
    if type(durs) is not list:
        return None
    n = len(durs)
    for j in range(1, len(PHASE_LISTS) + 1):
        if m.group(j).count(b",") + 1 != n:
            return None
    for k in PHASE_LISTS:
        if k in rec:  # the same key again elsewhere: JSON keeps the last one; let the full parse decide
            return None
    rec["first"] = {k: float(data[m.start(j):data.find(b",", m.start(j), m.end(j) + 1) if n > 1 else m.end(j)])
                    for j, k in enumerate(PHASE_LISTS, 1)}
    return rec


# long: the agent decodes every datagram here; one straight-line body keeps the per-datagram path free of calls
def decode(data: bytes, phases: bool = True, checks: Optional[Dict[int, Checks]] = None) -> Dict[str, Any]:
    """Parse and validate one datagram. Returns a normalized dict or raises ProtocolError.
    ``phases`` False (the agent): a "steps" record's phase lists are checked, and where they were
    cut out only the first step's values are returned, as "first": {field: seconds}.
    ``checks``: each version's step record (default: ``CHECKS``, from ranksight/record.py)."""
    if len(data) > MAX_DATAGRAM:
        raise ProtocolError(C.INGEST_OVERSIZE, f"{len(data)} bytes")
    if checks is None:
        checks = CHECKS
    rec = None if phases or checks is not CHECKS else _cut_phases(data)
    cut = rec is not None
    if not cut:
        try:
            rec = _parse(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise ProtocolError(C.INGEST_MALFORMED, "not JSON") from None
    if not isinstance(rec, dict):
        raise ProtocolError(C.INGEST_MALFORMED, "not an object")
    v = rec.get("v")
    if type(v) is not int or v not in checks:
        raise ProtocolError(C.INGEST_REJECTED, "version", version=v if type(v) in (int, str) else repr(v)[:32])
    get = rec.get
    try:
        t, job, ws, rank, lr, node, pid, ts = _IDENT(rec)
    except KeyError:  # a missing field: the checks below say which
        t, job, ws, rank, lr, node, pid, ts = (get("t"), get("job"), get("ws"), get("rank"), get("lr"), get("node"),
                                               get("pid"), get("ts"))
    # The common case in one expression; otherwise the field-by-field checks, which raise
    # with the reason (or accept what they accept, e.g. an integer ts).
    if not (type(t) is str and t in TYPES and type(job) is str and 0 < len(job) <= MAX_STR
            and type(ws) is int and 1 <= ws <= MAX_WORLD and type(rank) is int and 0 <= rank < ws
            and type(lr) is int and 0 <= lr <= 4095 and type(node) is str and len(node) <= MAX_STR
            and type(pid) is int and 0 <= pid <= 1 << 31 and type(ts) is float and 0.0 <= ts <= 1e11):
        t = _str(rec, "t", choices=TYPES)
        job = _str(rec, "job")
        if not job:
            raise ProtocolError(C.INGEST_REJECTED, "empty job")
        ws = _int(rec, "ws", 1, MAX_WORLD)
        rank = _int(rec, "rank", 0, ws - 1)
        lr = _int(rec, "lr", 0, 4095)
        node = _str(rec, "node")
        pid = _int(rec, "pid", 0, 1 << 31)
        ts = _secs(rec, "ts", 0.0, 1e11, default=None)
    elif t == "step" and checks[v].step(rec):
        if v == 1:
            return rec
        sess = get("sess")
        if type(sess) is int and 0 <= sess <= MAX_COUNT:
            return rec
    out: Dict[str, Any] = {"v": v, "t": t, "job": job, "ws": ws, "rank": rank, "lr": lr, "node": node, "pid": pid,
                           "ts": ts}
    if v >= 2:
        sess = get("sess", 0)
        out["sess"] = sess if type(sess) is int and 0 <= sess <= MAX_COUNT else _int(rec, "sess", 0, MAX_COUNT)
    if t == "step":
        # Inline checks for the common case (the agent decodes ~100 step records/s per rank);
        # anything else goes to _secs/_int, which accept or reject exactly as before.
        lay = checks[v].layout
        for k in lay.seconds:
            x = get(k, 0.0)
            out[k] = x if type(x) is float and 0.0 <= x <= MAX_SECONDS else _secs(rec, k)
        for k in ("seq",) + lay.counts + lay.last:
            x = get(k, 0)
            out[k] = x if type(x) is int and 0 <= x <= MAX_COUNT else _int(rec, k, 0, MAX_COUNT)
        for k, m in lay.least.items():
            if out[k] < m:
                out[k] = m
        out.update(lay.missing)
        if out["seq"] < 1:
            raise ProtocolError(C.INGEST_REJECTED, "bad seq")
    elif t == "steps":
        if v < 2:
            raise ProtocolError(C.INGEST_REJECTED, "steps needs v2")
        _steps(rec, out, checks[v], cut)
    elif t == "hb":
        out["seq"] = _int(rec, "seq", 0, MAX_COUNT)
        out["every"] = _secs(rec, "every", 0.01, 3600.0, default=1.0)
        out["step"] = _int(rec, "step", 0, MAX_COUNT) if "step" in rec else 0
        out["phase"] = _str(rec, "phase", choices=PHASES) if "phase" in rec else "other"
        out["coll"] = _secs(rec, "coll", -1.0, MAX_SECONDS, default=-1.0)
        out["probe"] = _secs(rec, "probe", 0.0, MAX_SECONDS, default=0.0)
        out["pdur"] = _secs(rec, "pdur", 0.0, MAX_SECONDS, default=0.0)
        out["herr"] = _int(rec, "herr", 0, MAX_COUNT) if "herr" in rec else 0
        if v >= 2 and "tot" in rec:
            _totals(rec, out, checks[v])
    elif t == "bye":
        if v >= 2 and "tot" in rec:
            _totals(rec, out, checks[v])
    elif t == "ckpt":
        out["dur"] = _secs(rec, "dur", default=None)
        out["bytes"] = _int(rec, "bytes", 0, MAX_BYTES)
        out["ok"] = _bool(rec, "ok")
        out["src"] = _str(rec, "src", choices=CKPT_SOURCES)
    elif t == "lint":
        out["lint"] = _str(rec, "lint", limit=64)
        out["active"] = _bool(rec, "active")
        out["msg"] = _str(rec, "msg", limit=MAX_MSG) if "msg" in rec else ""
        if "gbatch" in rec or "lrate" in rec:
            out["gbatch"] = _int(rec, "gbatch", 0, MAX_COUNT)
            out["lrate"] = _secs(rec, "lrate", 0.0, 1e6, default=None)
    elif t == "stack":
        frames = rec.get("frames")
        if (not isinstance(frames, list) or len(frames) > MAX_STACK_FRAMES
                or not all(isinstance(f, str) and len(f) <= MAX_STACK_FRAME for f in frames)):
            raise ProtocolError(C.INGEST_REJECTED, "bad frames")
        out["frames"] = frames
        out["where"] = _str(rec, "where", limit=MAX_STACK_WHERE)
        out["idle"] = _secs(rec, "idle", default=0.0)
        out["phase"] = _str(rec, "phase", choices=PHASES) if "phase" in rec else "other"
        if "cw" in rec:
            cw = rec["cw"]
            if not isinstance(cw, dict):
                raise ProtocolError(C.INGEST_REJECTED, "bad cw")
            out["cw"] = {"op": _str(cw, "op", limit=64), "pg": _str(cw, "pg"), "seq": _int(cw, "seq", 0, MAX_COUNT),
                         "wait": _secs(cw, "wait", default=0.0)}
    elif t == "hello":
        info = rec.get("info", {})
        if not isinstance(info, dict):
            raise ProtocolError(C.INGEST_REJECTED, "bad info")
        out["info"] = info
        dirs = rec.get("dirs", {})
        if not isinstance(dirs, dict) or not all(
            isinstance(k, str) and k in ("tmp", "log", "checkpoint") and isinstance(v, str) and len(v) <= 1024
            for k, v in dirs.items()
        ):
            raise ProtocolError(C.INGEST_REJECTED, "bad dirs")
        out["dirs"] = dirs
        if v >= 2:
            out["pstart"] = _secs(rec, "pstart", 0.0, 1e11, default=0.0)
            gpu = rec.get("gpu", "")
            if not isinstance(gpu, str) or len(gpu) > 96:
                raise ProtocolError(C.INGEST_REJECTED, "bad gpu")
            out["gpu"] = gpu
            if "gpu_every" in rec:  # (absent from older senders' hellos: decoded as they were)
                out["gpu_every"] = _int(rec, "gpu_every", 0, MAX_COUNT)
    return out


def _steps(rec: Dict[str, Any], out: Dict[str, Any], checks: Checks, cut: bool = False) -> None:
    """Validate a "steps" record into ``out`` (lists as sent, scalars, totals). ``cut``: the phase
    lists were checked and cut out before the parse (``_cut_phases``); they are not in ``out``."""
    seq = rec.get("seq")
    if type(seq) is not int or not 1 <= seq <= MAX_COUNT:
        raise ProtocolError(C.INGEST_REJECTED, "bad seq")
    out["seq"] = seq
    durs = rec.get("dur")
    if type(durs) is not list or not 1 <= len(durs) <= STEPS_MAX:
        raise ProtocolError(C.INGEST_REJECTED, "bad dur")
    n = out["n"] = len(durs)
    lay = checks.layout
    # v3: the step detail lists are all there or none is (their sums are in the totals)
    lists = checks.lists if any(k in rec for k in lay.detail) else checks.lists_required
    for k in ("dur",) if cut else lists[0]:
        vals = rec.get(k)
        if not _seconds_list(vals, n):  # int or float (a formatter writes 0.0 as 0); NaN and inf fail the range
            raise ProtocolError(C.INGEST_REJECTED, f"bad {k}")
        out[k] = vals
    if cut:
        out["first"] = rec["first"]
    elif lay.first:
        first = rec.get("first")
        if type(first) is not dict or len(first) != len(lay.first):
            raise ProtocolError(C.INGEST_REJECTED, "bad first")
        out["first"] = {k: _secs(first, k, default=None) for k in lay.first}
    for k in lists[1]:
        vals = rec.get(k)
        if not _count_list(vals, n):
            raise ProtocolError(C.INGEST_REJECTED, f"bad {k}")
        m = lay.least.get(k, 0)
        out[k] = vals if min(vals) >= m else [x if x >= m else m for x in vals]
    get = rec.get
    for k in lay.last:
        x = get(k, 0)
        out[k] = x if type(x) is int and 0 <= x <= MAX_COUNT else _int(rec, k, 0, MAX_COUNT)
    for k, x in lay.missing.items():
        out[k] = [x] * n if k in lay.per_step else x
    if "tot" not in rec:
        raise ProtocolError(C.INGEST_REJECTED, "steps without tot")
    _totals(rec, out, checks)


def expand_steps(rec: Dict[str, Any]) -> list:
    """A decoded "steps" record as the equivalent "step" records (``record.Layout.expand``)."""
    return LAYOUTS[rec["v"]].expand(rec)


# "tot" as the hooks send it (every key, ints and floats in range, the steps' checkpoint total or
# not, the last checkpoint's two keys or neither), checked by one compiled expression like the
# "step" record: then the parsed dict is the result. Anything else goes through the key-by-key
# checks below.
def _compile_totals_check(ints: Tuple[str, ...], secs: Tuple[str, ...]) -> Any:
    n = len(ints) + len(secs)
    return record.compile_check("_tot_fast", "rec", secs, MAX_TOTAL_SECONDS, ints, MAX_COUNT,
                                f"    m = len(rec)\n    if m < {n} or m > {n + 3}:\n        return False\n",
                                f"    if m == {n}:\n        return True\n"
                                f"    c = rec.get({TOTAL_STEP_CKPT!r})\n"
                                "    if c is not None:\n"
                                f"        if not (type(c) is float and 0.0 <= c <= {MAX_TOTAL_SECONDS!r}):\n"
                                "            return False\n"
                                f"        if m == {n + 1}:\n            return True\n"
                                f"    elif m != {n + 2}:\n        return False\n"
                                "    a = rec.get('lck'); b = rec.get('lckd')\n"
                                "    return type(a) is float and 0.0 <= a <= 1e11 and type(b) is float and 0.0 <= b <= 1e11\n")


CHECKS: Dict[int, Checks] = {v: Checks(lay) for v, lay in LAYOUTS.items()}
TOTAL_INT_KEYS, TOTAL_SECONDS_KEYS = CHECKS[VERSION].tot_ints, CHECKS[VERSION].tot_secs
HIST_SIZES = CHECKS[VERSION].hist_sizes  # "hist" key -> number of bucket counts (buckets + the +Inf bucket)


def _totals(rec: Dict[str, Any], out: Dict[str, Any], checks: Checks) -> None:
    """Validate "tot" and "hist" (v2 heartbeat and bye) into out["tot"], out["hist"]."""
    tot = rec.get("tot")
    if not isinstance(tot, dict):
        raise ProtocolError(C.INGEST_REJECTED, "bad tot")
    if checks.tot(tot):
        _hists(rec, out, checks)
        out["tot"] = tot
        return
    t: Dict[str, Any] = {}
    for k in checks.tot_ints:
        t[k] = _int(tot, k, 0, MAX_COUNT) if k in tot else 0
    for k in checks.tot_secs:
        t[k] = _secs(tot, k, 0.0, MAX_TOTAL_SECONDS)
    if TOTAL_STEP_CKPT in tot:
        t[TOTAL_STEP_CKPT] = _secs(tot, TOTAL_STEP_CKPT, 0.0, MAX_TOTAL_SECONDS)
    for k in ("lck", "lckd"):
        if k in tot:
            t[k] = _secs(tot, k, 0.0, 1e11, default=None)
    _hists(rec, out, checks)
    out["tot"] = t


def _hists(rec: Dict[str, Any], out: Dict[str, Any], checks: Checks) -> None:
    hist = rec.get("hist", {})
    if not isinstance(hist, dict):
        raise ProtocolError(C.INGEST_REJECTED, "bad hist")
    h: Dict[str, Any] = {}
    for k, n in checks.hist_sizes.items():
        counts = hist.get(k)
        if counts is None:
            continue
        if not _count_list(counts, n):
            raise ProtocolError(C.INGEST_REJECTED, f"bad hist {k}")
        h[k] = counts
    out["hist"] = h
