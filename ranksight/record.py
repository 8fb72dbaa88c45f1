"""The step record, declared once.

``FIELDS`` lists every value a rank reports with each optimizer step: its wire key, type, unit,
how it adds up (per step, cumulative in the process, or a current reading), the protocol
versions that carry it and the catalog metric the agent exposes it as. Everything that handles a
step derives from this table, computed once at import:

- the hooks: the queued step tuple's layout (``Layout.index``), the "steps" record's encoder
  (``Layout.encode_steps``: format strings built here, no loop over fields per step) and the
  session totals' straight-line adder (``Layout.compile_totals``), in ``hooks/``;
- the agent: the decoder's field lists and compiled checks (``ranksight/protocol.py``), the
  rank's sums, cumulative counters and readings (``exporter/ranks.py``), and which metric family
  each one is exposed as (``exporter/collectors/ranks.py``);
- the tests: recorded datagrams of every version (``tests/fixtures/protocol``) decode through
  the same code.

The key is the field's one name: the hooks accumulate ``data`` in ``Watcher._data``, send it as
``"data"``, and the agent sums it in ``Rank.sums["data"]`` and exposes that sum as
``ranksight_dataloader_wait_seconds_total`` (``catalog.DATALOADER_WAIT``).

Adding a field is one ``Field(...)`` line here (with ``since`` the version that starts carrying
it) plus its test, and the code that measures it: the step path builds its tuple inline, for
speed, in the per-step fields' order here (``StepPath._step_end``; tests/unit/test_record.py
checks the order on a real watch), and ``Background.step_state`` reads the cumulative and current
ones. A field a version no longer carries gets ``until``. A version that does not carry a field
decodes it as 0, so the agent treats old and new senders alike. A per-step field whose list the
agent does not read gets ``detail``: from that version on its list is sent only with step detail
(hooks.step_detail; its sum still goes in the totals), and ``first`` marks those whose first
step's value the agent reads: the record carries them under "first".
Torch-free: shared by the hooks and the agent.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ranksight import catalog as C

DETAIL = 3  # the first protocol version whose "steps" records carry the per-step lists but "dur" as step detail
PER_STEP = "per_step"  # this step's amount; the totals sum it, the agent exposes the sum as a counter
CUMULATIVE = "cumulative"  # the process's running count at the step; the agent turns it into a counter
CURRENT = "current"  # a reading at the step; the agent exposes the last one as a gauge
KINDS = (PER_STEP, CUMULATIVE, CURRENT)

_INF = float("inf")
STEP_DIGITS = "%.6g"  # significant digits of a per-step seconds value in a "steps" record
TUPLE_HEAD = 3  # a queued step tuple: ("step", seq, perf_counter at the step's end, *per-step values)


@dataclass(frozen=True)
class Field:
    key: str  # the wire key, and the name the hooks and the agent use for it
    type: type  # float | int
    unit: str  # seconds | count | bytes | loss (the training loss, dimensionless)
    kind: str  # PER_STEP | CUMULATIVE | CURRENT
    help: str
    metric: Optional[C.Metric] = None  # the sum (PER_STEP), the counter (CUMULATIVE) or the gauge (CURRENT)
    hist: Optional[C.Metric] = None  # PER_STEP: each step's value is also observed in this histogram
    hist_key: str = ""  # its key in the totals' "hist" (default: the field's key)
    gpu: bool = False  # on CUDA, resolved from events a step or more late (hooks/timing.py kind == key)
    least: int = 0  # smallest value a step sends; the decoder raises a smaller one to it
    since: int = 1  # the first protocol version carrying the field
    until: Optional[int] = None  # the last one (None: every newer version)
    # PER_STEP: from this protocol version on, a "steps" record carries the field's per-step list
    # only when the hooks are asked for step detail (hooks.step_detail); its sum is in the totals
    detail: Optional[int] = None
    first: bool = False  # PER_STEP: the agent reads the first step's value of a "steps" record
    gate: str = ""  # a CURRENT field's key: the agent exposes this field only for ranks whose reading of it is not 0

    def detail_in(self, version: int) -> bool:
        """The field's per-step list is step detail in ``version`` (sent on request only)."""
        return self.detail is not None and version >= self.detail

    def on(self, version: int) -> bool:
        return self.since <= version and (self.until is None or version <= self.until)


F, I = float, int
FIELDS: Tuple[Field, ...] = (
    Field("dur", F, "seconds", PER_STEP, "step duration, step boundary to step boundary",
          C.STEP_SECONDS, C.STEP_DURATION, hist_key="step"),
    Field("data", F, "seconds", PER_STEP, "dataloader wait: time in next() on the loader, over the step's micro-batches",
          C.DATALOADER_WAIT, C.DATALOADER_WAIT_HIST, detail=DETAIL, first=True),
    Field("fwd", F, "seconds", PER_STEP, "forward time", C.FORWARD_SECONDS, gpu=True, detail=DETAIL),
    Field("bwd", F, "seconds", PER_STEP, "backward time (gradient computation)", C.BACKWARD_SECONDS, gpu=True,
          detail=DETAIL),
    Field("opt", F, "seconds", PER_STEP, "optimizer.step() time", C.OPTIMIZER_SECONDS, gpu=True, detail=DETAIL),
    Field("b2o", F, "seconds", PER_STEP, "backward start to optimizer.step() start", hist=C.BACKWARD_TO_OPTIMIZER,
          detail=DETAIL),
    Field("comm", F, "seconds", PER_STEP, "collective time, launch to completion", C.COMM_SECONDS, gpu=True,
          detail=DETAIL),
    Field("xcomm", F, "seconds", PER_STEP, "exposed (not overlapped) communication", C.EXPOSED_COMM_SECONDS,
          gpu=True, detail=DETAIL, first=True),
    Field("ckpt", F, "seconds", PER_STEP, "checkpoint time inside the step", C.CHECKPOINT_SECONDS,
          detail=DETAIL, first=True),
    Field("micro", I, "count", PER_STEP, "micro-batches (forwards with grad)", C.MICROBATCHES, least=1,
          detail=DETAIL),
    Field("samples", I, "count", PER_STEP, "samples in the step's batches", C.SAMPLES, since=4, detail=4),
    Field("tokens", I, "count", PER_STEP, "tokens in the step's batches", C.TOKENS, since=4, detail=4),
    # the training loss (hooks/loss.py): finite values in [0, MAX_SECONDS], read a step or more late on CUDA
    Field("loss", F, "loss", PER_STEP, "sum of the finite training losses read at the step", C.LOSS_SUM, since=4,
          detail=4),
    Field("lossn", I, "count", PER_STEP, "finite training losses read at the step (the terms of loss)",
          C.LOSS_READINGS, since=4, detail=4),
    # a pipeline-parallel stage (hooks/pipeline.py); exposed for ranks watched as a stage (pstages > 0)
    Field("pbusy", F, "seconds", PER_STEP, "pipeline stage compute: time in its forward and backward chunks",
          C.PIPELINE_BUSY, gpu=True, since=5, detail=5, gate="pstages"),
    Field("pstep", F, "seconds", PER_STEP, "time in the pipeline schedule's step()", C.PIPELINE_STEP, since=5,
          detail=5, gate="pstages"),
    Field("pwprev", F, "seconds", PER_STEP, "P2P wait on the previous pipeline stage (activations in, gradients out)",
          C.PIPELINE_WAIT_PREV, since=5, detail=5, gate="pstages"),
    Field("pwnext", F, "seconds", PER_STEP, "P2P wait on the next pipeline stage (gradients in, activations out)",
          C.PIPELINE_WAIT_NEXT, since=5, detail=5, gate="pstages"),
    Field("retries", I, "count", CUMULATIVE, "CUDA allocator retries (num_alloc_retries)", C.CUDA_ALLOC_RETRIES),
    Field("ooms", I, "count", CUMULATIVE, "CUDA out-of-memory errors", C.CUDA_OOMS),
    Field("mres", I, "bytes", CURRENT, "CUDA reserved bytes", C.CUDA_RESERVED),
    Field("malloc", I, "bytes", CURRENT, "CUDA allocated bytes", C.CUDA_ALLOCATED),
    # the allocator's peaks (hooks/memory.py): read and reset on the background thread, never on the step path
    Field("mpeak", I, "bytes", CURRENT, "CUDA allocated bytes' peak over the last peak windows (0 without CUDA)",
          C.CUDA_ALLOCATED_PEAK, since=5),
    Field("mrpeak", I, "bytes", CURRENT, "CUDA reserved bytes' peak over the last peak windows (0 without CUDA)",
          C.CUDA_RESERVED_PEAK, since=5),
    Field("herr", I, "count", CUMULATIVE, "hook errors", C.HOOK_ERRORS),
    Field("hdrop", I, "count", CUMULATIVE, "dropped GPU timing events", C.HOOK_DROPPED_EVENTS),
    Field("wrss", I, "bytes", CURRENT, "DataLoader workers' total RSS (0 without workers)", C.DATALOADER_WORKERS_RSS),
    Field("restart", I, "count", CURRENT, "restart count from the launcher", C.RANK_RESTARTS),
    Field("fpt", I, "count", CURRENT, "model FLOPs per token, declared or estimated once (hooks/flops.py)",
          C.MODEL_FLOPS_PER_TOKEN, since=4),
    Field("lnan", I, "count", CUMULATIVE, "non-finite (NaN, infinite) training losses", C.LOSS_NONFINITE, since=4),
    Field("lnanstep", I, "count", CURRENT, "the step of the first non-finite training loss (0: none)",
          C.LOSS_FIRST_NONFINITE_STEP, since=4),
    Field("pstage", I, "count", CURRENT, "the rank's index in its pipeline group", C.PIPELINE_STAGE, since=5,
          gate="pstages"),
    Field("pstages", I, "count", CURRENT, "ranks in the pipeline group (0: not watched as a pipeline stage)",
          C.PIPELINE_STAGES, since=5, gate="pstages"),
    Field("pmb", I, "count", CURRENT, "micro-batch forwards per schedule step: micro-batches x the rank's stages",
          C.PIPELINE_MICROBATCHES, since=5, gate="pstages"),
    # a checkpoint restore (hooks/resume.py) and the run's length: the loss jump after a resume, the ETA
    Field("resumed", I, "seconds", CURRENT, "wall time (Unix seconds) of the process's last checkpoint restore "
          "(0: none)", C.LAST_RESUME, since=5),
    Field("rstep", I, "count", CURRENT, "the step the process resumed from (0: none known)", C.RESUME_STEP, since=5),
    Field("total", I, "count", CURRENT, "the run's total optimizer steps, declared or the framework's (0: unknown)",
          C.TOTAL_STEPS, since=5),
)
del F, I


def _catalog_order(m: C.Metric) -> int:
    """Where ``m`` sits in the catalog (a metric outside it, e.g. a test's, after every one in it)."""
    known = list(C.CATALOG.values())
    return known.index(m) if m in known else len(known)


class Layout:
    """The step record of one protocol version, derived from a declaration (``FIELDS`` or a
    test's copy): key lists, the step tuple's layout, the encoder and the exposition's pairs."""

    def __init__(self, fields: Sequence[Field] = FIELDS, version: int = 0, detail: bool = True):
        bad = [f.key for f in fields if f.kind not in KINDS or f.type not in (float, int)
               or (f.kind != PER_STEP and (f.type is not int or f.hist is not None))]
        if bad or len({f.key for f in fields}) != len(fields):
            raise ValueError(f"step record declaration: bad or repeated fields {bad}")
        self.fields = tuple(fields)  # every version's: the agent keeps them all
        self.version = version
        sent = tuple(f for f in fields if version == 0 or f.on(version))
        self.sent = sent  # what this version carries
        self.per_step = tuple(f.key for f in fields if f.kind == PER_STEP)  # the step tuple's values, in order
        self.index: Dict[str, int] = {k: TUPLE_HEAD + i for i, k in enumerate(self.per_step)}
        self.seconds = tuple(f.key for f in sent if f.kind == PER_STEP and f.type is float)  # (and the loss sum)
        self.counts = tuple(f.key for f in sent if f.kind == PER_STEP and f.type is int)
        self.last = tuple(f.key for f in sent if f.kind != PER_STEP)  # one value per record, at its last step
        # a "steps" record's per-step lists that are step detail in this version (all or none of
        # them in a record), and the first step's values it carries under "first" instead
        self.detail = tuple(f.key for f in sent if f.kind == PER_STEP and f.detail_in(version))
        self.first = tuple(f.key for f in sent if f.first and f.detail_in(version))
        self.send_detail = detail or not self.detail  # this layout's encoder writes the detail lists
        self.least = {f.key: f.least for f in sent if f.least}
        # what the agent reads for a field this version does not carry: 0 (or its least)
        self.missing = {f.key: f.type(f.least) for f in fields if f not in sent}
        self.cumulative = tuple(f.key for f in fields if f.kind == CUMULATIVE)
        self.current = tuple(f.key for f in fields if f.kind == CURRENT)
        self.gpu = tuple(f.key for f in fields if f.gpu)
        # exposition: (metric, key) pairs, each group in catalog order (the order of the scrape)
        per = [f for f in fields if f.kind == PER_STEP and f.metric is not None]
        self.sums = tuple((f.metric, f.key) for f in sorted(per, key=lambda f: _catalog_order(f.metric)))
        self.cum_metrics = tuple((f.metric, f.key) for f in fields if f.kind == CUMULATIVE and f.metric)
        self.cur_metrics = tuple((f.metric, f.key) for f in fields if f.kind == CURRENT and f.metric)
        # key -> the CURRENT field whose non-zero reading the exposition of the key's series needs
        self.gate = {f.key: f.gate for f in fields if f.gate}
        if not set(self.gate.values()) <= set(self.current):
            raise ValueError(f"step record declaration: a gate that is not a current field {self.gate}")
        # histograms: (totals' "hist" key, metric, field key), in catalog order
        hs = sorted((f for f in fields if f.hist is not None), key=lambda f: _catalog_order(f.hist))
        self.hists = tuple((f.hist_key or f.key, f.hist, f.key) for f in hs)
        # encoder of a "steps" record's per-step lists and last values: (key, tuple index, format)
        written = set(self.seconds + self.counts) - (set() if self.send_detail else set(self.detail))
        self.columns = tuple((k, self.index[k], STEP_DIGITS) for k in self.seconds if k in written) + tuple(
            (k, self.index[k], "%d") for k in self.counts if k in written)
        # the lists it does not write are checked all the same (their values go in the totals)
        self.unwritten = tuple((k, self.index[k]) for k in self.seconds + self.counts if k not in written)
        # ... and of the first step's values: "first":{"data":%s,...}, formatted like the lists
        self._first = itemgetter(*(self.index[k] for k in self.first)) if self.first else None
        self._first_fmt = ',"first":{' + ",".join('"%s":%s' % (k, STEP_DIGITS) for k in self.first) + "}"
        # bytes of the lists' text that are not per step: the count lists' keys and the "first"
        # object (the sender's estimate of a step's bytes counts the seconds lists' keys with the values)
        self.lists_fixed = sum(len(',"%s":[]' % k) for k, _, fmt in self.columns if fmt == "%d") + (
            len(self._first_fmt) if self.first else 0)
        self._last_fmt = ",".join('"%s":%%d' % k for k in self.last)
        self._totals: Optional[Callable[..., None]] = None
        self.steps_fmt = '%s"ts":%.6f,"seq":%d,%s' + (',' + self._last_fmt if self.last else "") + ",%s}"

    def step_tuple(self, seq: int, t: float, values: Dict[str, Any]) -> tuple:
        """A queued step tuple from ``{key: value}`` (tests; the step path builds its tuple inline)."""
        return ("step", seq, t) + tuple(values.get(k, 0) for k in self.per_step)

    def encode_lists(self, batch: List[tuple]) -> str:
        """The per-step lists of a "steps" record for consecutive step tuples (and "first", in a
        version that has it). A NaN, an infinity or a negative value, in a list written or not,
        raises ValueError (the text or the totals would not be valid JSON, or the agent would
        reject the record)."""
        cols = []
        for k, j, fmt in self.columns:
            nums = ",".join([fmt % it[j] for it in batch])
            if "n" in nums or "-" in nums.replace("e-", ""):
                raise ValueError(f"step record with a non-finite or negative {k}: {nums}")
            cols.append(f'"{k}":[{nums}]')
        for k, j in self.unwritten:
            vals = [it[j] for it in batch]
            s = sum(vals)
            if not (s == s and s < _INF and min(vals) >= 0):
                raise ValueError(f"step record with a non-finite or negative {k}: {vals}")
        out = ",".join(cols)
        if self._first is not None:
            vals = self._first(batch[0])
            vals = vals if len(self.first) > 1 else (vals,)
            if not all(0.0 <= x < _INF for x in vals):
                raise ValueError(f"step record with a non-finite or negative first value: {vals}")
            out += self._first_fmt % vals
        return out

    def encode_steps(self, prefix: str, ts: float, seq: int, lists: str, last: Sequence[int], tail: str) -> str:
        """A "steps" record: ``prefix`` (the identity, from ``{`` to the comma after
        ``"t":"steps"``), the last step's wall time, the first step's number, ``lists``
        (``encode_lists``), ``last`` (the values of ``self.last``, in order) and ``tail`` (the
        totals' JSON members)."""
        return self.steps_fmt % ((prefix, ts, seq, lists) + tuple(last) + (tail,))

    def expand(self, rec: Dict[str, Any]) -> List[Dict[str, Any]]:
        """A decoded "steps" record of this version as the equivalent "step" records (for tools
        that look at each step): the per-step values of the lists it carries (v3: the step detail
        ones only when they were sent), the last values on every step. A step's ``ts`` is the
        record's minus the durations of the steps after it."""
        n = rec["n"]
        floats = set(self.seconds) | {k for k, x in self.missing.items() if type(x) is float}
        ends = [rec["ts"]] * n
        for i in range(n - 2, -1, -1):
            ends[i] = ends[i + 1] - rec["dur"][i + 1]
        ident = {k: rec[k] for k in ("v", "job", "ws", "rank", "lr", "node", "pid", "sess") if k in rec}
        sent = [k for k in self.per_step if k in rec]
        out = []
        for i in range(n):
            step = dict(ident, t="step", ts=ends[i], seq=rec["seq"] + i)
            for k in sent:
                step[k] = float(rec[k][i]) if k in floats else rec[k][i]
            for k in self.cumulative + self.current:
                step[k] = rec[k]
            out.append(step)
        return out

    def compile_totals(self) -> Callable[..., None]:
        """``step(totals, it, sign=1)``: straight-line code adding a step tuple's per-step values
        to ``totals.v`` (key -> sum, and "steps") and its histogram values to ``totals.hists``
        ({"hist" key: (buckets, counts)}), ``sign`` -1 taking a step back. Compiled once per layout."""
        if self._totals is None:
            n = TUPLE_HEAD + len(self.per_step)
            names = ["_"] * TUPLE_HEAD + [f"x_{k}" for k in self.per_step]
            lines = ["def step(self, it, sign=1):", f"    {', '.join(names)}, = it" if n > 1 else "",
                     "    v = self.v", "    if sign == 1:", "        v['steps'] += 1"]
            lines += [f"        v[{k!r}] += x_{k}" for k in self.per_step]
            lines += ["    else:", "        v['steps'] += sign"]
            lines += [f"        v[{k!r}] += sign * x_{k}" for k in self.per_step]
            ns: Dict[str, Any] = {"_bisect": bisect_left}
            if self.hists:
                lines.append("    h = self.hists")
            for i, (hk, m, k) in enumerate(self.hists):
                ns[f"_b{i}"] = m.buckets
                lines.append(f"    h[{hk!r}][1][_bisect(_b{i}, x_{k})] += sign")
            exec(compile("\n".join(lines) + "\n", "<ranksight.record totals>", "exec"), ns)
            self._totals = ns["step"]
        return self._totals


ALL = Layout(FIELDS)  # every field of every version: what the hooks queue and the agent keeps


def layouts(versions: Sequence[int], fields: Sequence[Field] = FIELDS) -> Dict[int, Layout]:
    """Each version's layout of ``fields`` (its encoder writes the step detail)."""
    return {v: Layout(fields, v) for v in versions}


def compile_check(name: str, params: str, floats: Tuple[str, ...], float_hi: float, ints: Tuple[str, ...],
                  int_hi: int, head: str, tail: str) -> Any:
    """``def name(params)``: ``head`` (it may return early), then every key of ``floats`` and
    ``ints`` read in one itemgetter (a missing one: False) and checked in one expression (a float
    in [0, float_hi], an int in [0, int_hi]), then ``tail``. The keys are locals ``_<key>``.
    The decoder's fast checks of a record's fields (ranksight/protocol.py)."""
    names = floats + ints
    checks = [f"type(_{k}) is float and 0.0 <= _{k} <= {float_hi!r}" for k in floats]
    checks += [f"type(_{k}) is int and 0 <= _{k} <= {int_hi!r}" for k in ints]
    src = (f"def {name}({params}, _get=_fields):\n{head}"
           f"    try:\n        {', '.join(f'_{k}' for k in names)}, = _get(rec)\n    except KeyError:\n        return False\n"
           f"    if not (" + " and ".join(checks) + "):\n        return False\n" + tail)
    ns: Dict[str, Any] = {"_fields": itemgetter(*names)}
    exec(compile(src, f"<ranksight.record {name}>", "exec"), ns)
    return ns[name]
