"""Pipeline parallelism: ``ranksight.watch(schedule, optimizer, loader)`` with a
``torch.distributed.pipelining`` schedule (``ScheduleGPipe``, ``Schedule1F1B``,
``ScheduleInterleaved1F1B``, ...), or with a ``PipelineStage``; and a DeepSpeed ``PipelineEngine``
given to ``watch`` (``deepspeed_engine.py`` calls ``attach_deepspeed``: its forward and backward
passes are the compute, its send and receive instructions the waits).

A rank of the pipeline group runs one stage (or, in an interleaved schedule, several). In a step
``schedule.step(...)`` runs the stage's micro-batches: ``stage.forward_one_chunk`` and
``stage.backward_one_chunk`` (``backward_weight_one_chunk`` in zero-bubble schedules) compute,
and between them the schedule waits, in ``schedules._wait_batch_p2p``, on the P2P works that
``schedules._batch_p2p`` launched: activations from the stage before, gradients from the stage
after. What this module measures, per optimizer step (the step record's fields, ``ranksight/
record.py``):

``pbusy``   the stage's compute: the time inside its forward and backward chunks (on CUDA, CUDA
            events recorded before and after each chunk on the current stream, resolved later
            like the other GPU phases, ``timing.CudaTimeline``);
``pstep``   the time inside ``schedule.step()`` (given a stage and no schedule: from the first
            chunk or P2P wait of the step to the end of the last one);
``pwprev``  time blocked in ``Work.wait()`` on the P2P works exchanged with the stage before:
            receiving its activations, or sending it gradients;
``pwnext``  the same with the stage after: receiving its gradients, or sending it activations.

The stage's bubble share is ``1 - pbusy / pstep``: the share of the schedule's step in which the
stage does not compute. For p stages and m micro-batches GPipe and 1F1B have an ideal bubble of
(p-1)/(m+p-1); with v stages per rank (interleaved) (p-1)/(v·m+p-1). The record also carries the
rank's place in the pipeline as current readings: ``pstage`` (the rank in the pipeline group),
``pstages`` (the group's size, 0 when the rank is not watched as a pipeline stage) and ``pmb``
(micro-batches per step times the rank's stages: v·m).

A stage's P2P is not collective time: the communication tracker (``comm.py``) does not count the
stage's P2P launches and waits in ``comm`` (so a pipeline's bubble never reads as a communication-
bound job), while its waits count as exposed communication (``xcomm``, on the host), so the rank's
busy time (step minus data wait, exposed communication and checkpoint) stays its compute.

Which neighbour a works list waits on: the stage's ``get_fwd_recv_ops``, ``get_bwd_recv_ops``,
``get_fwd_send_ops`` and ``get_bwd_send_ops`` are wrapped (instance attributes, through the
Watcher's Patcher) to note each P2POp's side; the wrapped ``_batch_p2p`` returns the works of
noted ops as a list that carries their side; the wrapped ``_wait_batch_p2p`` adds its time to
that side (half to each when a list holds both). Host timestamps only: nothing synchronizes the
device, and every wrapper catches its own errors (counted as hook errors).
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Any, Callable, Dict, List, Optional

from .patch import like

log = logging.getLogger("ranksight.hooks")
_perf = time.perf_counter

from .timing import PBUSY  # noqa: E402  (the CUDA timeline's kind of a chunk's compute)
PREV, NEXT, BOTH = 1, 2, 3
SCHEDULE_CLASSES = frozenset(("_PipelineSchedule",))
STAGE_CLASSES = frozenset(("_PipelineStageBase",))
COMPUTE = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
OPS = (("get_fwd_recv_ops", PREV), ("get_bwd_send_ops", PREV), ("get_bwd_recv_ops", NEXT),
       ("get_fwd_send_ops", NEXT))
SCHEDULES = "torch.distributed.pipelining.schedules"


def _is(obj: Any, names: frozenset) -> bool:
    try:
        return any(c.__name__ in names for c in type(obj).__mro__)
    except Exception:
        return False


def is_pipeline(obj: Any) -> bool:
    """``obj`` is a ``torch.distributed.pipelining`` schedule or stage (by class name)."""
    return obj is not None and (_is(obj, SCHEDULE_CLASSES) or _is(obj, STAGE_CLASSES))


class _Works(list):
    """The works ``_batch_p2p`` returned for ops of a watched stage, with their side."""

    side = 0


class _NoComm:
    """Inside it the communication tracker (``comm.py``) does not count the wrapped collectives
    and ``Work.wait`` calls (its re-entry guard): a stage's P2P is not collective time."""

    __slots__ = ("_tls", "_was")

    def __init__(self, comm: Any):
        self._tls = comm._tls

    def __enter__(self) -> None:
        self._was = getattr(self._tls, "depth", 0)
        self._tls.depth = 1

    def __exit__(self, *exc: Any) -> None:
        self._tls.depth = self._was


class PipelineTimer:
    """The pipeline's measurements of one watch, added to the Watcher's per-step accumulators
    (``_pbusy``, ``_pstep``, ``_pwprev``, ``_pwnext``); the Watcher sends and resets them."""

    def __init__(self, w: Any, schedule: Any, stages: List[Any], place: tuple):
        self.w = w
        self.schedule = schedule
        self.stages = stages
        self._side: Dict[int, int] = {}  # id(P2POp) -> side, from the op getters to _batch_p2p
        self._depth = 0  # compute chunks in progress (a chunk that calls another counts once)
        self._in_step = False
        self._first: Optional[float] = None  # given no schedule: the step's first chunk or wait
        self._last = 0.0
        w._pipe = place  # (pipeline rank, pipeline ranks, micro-batch forwards per step)

    # ------------------------------------------------------------------ wrappers
    def wrap_compute(self, orig: Callable, name: str) -> Callable:
        t = self

        def chunk(*args: Any, **kwargs: Any) -> Any:
            w = t.w
            if not w._active or t._depth:
                return orig(*args, **kwargs)
            tl = w._tl
            try:
                t._depth = 1
                t0 = _perf()
                ev0 = tl.mark(True) if tl is not None and tl.on else None  # (on False: a step not timed)
            except Exception as e:
                t._depth = 0
                w._hook_error("pipeline chunk start", e)
                return orig(*args, **kwargs)
            try:
                return orig(*args, **kwargs)
            finally:
                t._depth = 0
                try:
                    t1 = _perf()
                    if tl is None:
                        w._pbusy += t1 - t0
                    elif tl.on or ev0 is not None:
                        tl.push(PBUSY, ev0, tl.mark(True))
                    t._span(t0, t1)
                except Exception as e:
                    w._hook_error("pipeline chunk end", e)

        return like(chunk, orig, name)

    def wrap_ops(self, orig: Callable, name: str, side: int) -> Callable:
        t = self

        def get_ops(*args: Any, **kwargs: Any) -> Any:
            ops = orig(*args, **kwargs)
            if t.w._active:
                try:
                    for op in ops:
                        t._side[id(op)] = side
                except Exception as e:
                    t.w._hook_error("pipeline P2P ops", e)
            return ops

        return like(get_ops, orig, name)

    def wrap_batch_p2p(self, orig: Callable) -> Callable:
        t = self

        def _batch_p2p(p2p_ops: Any, *args: Any, **kwargs: Any) -> Any:
            if not t._side:
                return orig(p2p_ops, *args, **kwargs)
            side = 0
            try:
                pop = t._side.pop
                for op in p2p_ops:
                    side |= pop(id(op), 0)
            except Exception as e:
                t.w._hook_error("pipeline P2P launch", e)
            if not side:
                return orig(p2p_ops, *args, **kwargs)
            with t._not_collective():
                works = orig(p2p_ops, *args, **kwargs)
            if isinstance(works, list):
                out = _Works(works)
                out.side = side
                return out
            return works

        return like(_batch_p2p, orig, "_batch_p2p")

    def wrap_wait(self, orig: Callable) -> Callable:
        t = self

        def _wait_batch_p2p(work: Any, *args: Any, **kwargs: Any) -> Any:
            side = getattr(work, "side", 0)
            if not side or not t.w._active:
                return orig(work, *args, **kwargs)
            t0 = _perf()
            try:
                with t._not_collective():
                    return orig(work, *args, **kwargs)
            finally:
                try:
                    t1 = _perf()
                    w = t.w
                    d = t1 - t0
                    if side == PREV:
                        w._pwprev += d
                    elif side == NEXT:
                        w._pwnext += d
                    else:
                        w._pwprev += d / 2
                        w._pwnext += d / 2
                    if w._tl is None:  # exposed communication too (host time; see the module's docstring)
                        w.comm.add_exposed(t0, t1)
                    t._span(t0, t1)
                except Exception as e:
                    t.w._hook_error("pipeline P2P wait", e)

        return like(_wait_batch_p2p, orig, "_wait_batch_p2p")

    def wrap_p2p(self, orig: Callable, name: str, side: int) -> Callable:
        """A DeepSpeed pipeline instruction that sends or receives (``side``: the neighbour)."""
        t = self

        def p2p(*args: Any, **kwargs: Any) -> Any:
            if not t.w._active:
                return orig(*args, **kwargs)
            t0 = _perf()
            try:
                with t._not_collective():
                    return orig(*args, **kwargs)
            finally:
                try:
                    t1 = _perf()
                    w = t.w
                    if side == PREV:
                        w._pwprev += t1 - t0
                    else:
                        w._pwnext += t1 - t0
                    if w._tl is None:
                        w.comm.add_exposed(t0, t1)
                    t._span(t0, t1)
                except Exception as e:
                    t.w._hook_error("pipeline P2P", e)

        return like(p2p, orig, name)

    def _not_collective(self) -> "_NoComm":
        return _NoComm(self.w.comm)

    def wrap_step(self, orig: Callable) -> Callable:
        t = self

        def step(*args: Any, **kwargs: Any) -> Any:
            if t._in_step or not t.w._active:
                return orig(*args, **kwargs)
            t._in_step = True
            t0 = _perf()
            try:
                return orig(*args, **kwargs)
            finally:
                t._in_step = False
                try:
                    t.w._pstep += _perf() - t0
                    t._side.clear()  # ops a failed step never launched
                except Exception as e:
                    t.w._hook_error("pipeline step", e)

        return like(step, orig, "step")

    # ------------------------------------------------------------------ given a stage: the step's span
    def _span(self, t0: float, t1: float) -> None:
        if self.schedule is None:
            if self._first is None:
                self._first = t0
            self._last = t1

    def step_end(self) -> None:
        """At the optimizer step's end (``StepPath._step_end``): given no schedule, the span of the
        step's chunks and waits is its pipeline time."""
        if self.schedule is None and self._first is not None:
            self.w._pstep += max(0.0, self._last - self._first)
            self._first = None
            self._side.clear()


def stages_of(obj: Any) -> List[Any]:
    """The stages a schedule runs on this rank (or ``[obj]`` for a stage)."""
    if _is(obj, STAGE_CLASSES):
        return [obj]
    st = getattr(obj, "_stages", None)
    if st:
        return list(st)
    one = getattr(obj, "_stage", None)
    return [one] if one is not None else []


def attach(w: Any, obj: Any) -> Optional[PipelineTimer]:
    """Wrap the stages' compute and P2P op getters, the schedule's ``step`` and the schedules
    module's ``_batch_p2p``/``_wait_batch_p2p``, through ``w``'s Patcher (``close()`` restores them)."""
    schedule = obj if _is(obj, SCHEDULE_CLASSES) else None
    stages = stages_of(obj)
    if not stages:
        log.warning("ranksight: this pipeline schedule has no stages; its stages are not timed")
        return None
    st = stages[0]
    m = int(getattr(schedule, "_n_microbatches", 0) or 0)
    t = PipelineTimer(w, schedule, stages, (int(getattr(st, "group_rank", 0)), int(getattr(st, "group_size", 1)),
                                            m * len(stages)))
    p = w._patcher
    own = [(o, n) for o in ([schedule] if schedule is not None else []) + stages
           for n in ("step",) + COMPUTE + tuple(n for n, _ in OPS) if n not in getattr(o, "__dict__", {})]
    w.add_close_callback(lambda: _unshadow(own))
    for st in stages:
        for name in COMPUTE:
            fn = getattr(st, name, None)
            if callable(fn):
                p.set(st, name, t.wrap_compute(fn, name))
        for name, side in OPS:
            fn = getattr(st, name, None)
            if callable(fn):
                p.set(st, name, t.wrap_ops(fn, name, side))
    if schedule is not None:
        p.set(schedule, "step", t.wrap_step(schedule.step))
    mod = sys.modules.get(SCHEDULES)
    if mod is None:
        import importlib

        mod = importlib.import_module(SCHEDULES)
    p.set(mod, "_batch_p2p", t.wrap_batch_p2p(mod._batch_p2p))
    p.set(mod, "_wait_batch_p2p", t.wrap_wait(mod._wait_batch_p2p))
    w.pipeline = t
    return t


# DeepSpeed's PipelineEngine runs a step as instructions (``engine._INSTRUCTION_MAP``: instruction
# class -> engine method): the compute ones, and the P2P ones by the neighbour they wait on
DS_COMPUTE = ("ForwardPass", "BackwardPass")
DS_P2P = {"RecvActivation": PREV, "SendGrad": PREV, "RecvGrad": NEXT, "SendActivation": NEXT}


def is_deepspeed_pipe(engine: Any) -> bool:
    """``engine`` is a DeepSpeed ``PipelineEngine`` (by its instruction map, deepspeed not imported)."""
    return isinstance(getattr(type(engine), "_INSTRUCTION_MAP", None), dict) and hasattr(engine, "stage_id")


def attach_deepspeed(w: Any, engine: Any) -> Optional[PipelineTimer]:
    """Time a DeepSpeed ``PipelineEngine``'s stage: its instruction map, copied onto the engine
    with the forward and backward passes and the sends and receives wrapped (``close()`` restores
    the class's map). A step's pipeline time is ``engine.train_batch``: ``deepspeed_engine.attach``
    then wraps it (outside this wrapper) so that the step closes when it returns."""
    table = type(engine)._INSTRUCTION_MAP
    t = PipelineTimer(w, engine, [], (int(engine.stage_id), int(engine.num_stages), int(engine.micro_batches)))
    if "train_batch" not in getattr(engine, "__dict__", {}):
        w.add_close_callback(lambda: _unshadow([(engine, "train_batch")]))
    w._patcher.set(engine, "train_batch", t.wrap_step(engine.train_batch))
    new = {}
    for cls, fn in table.items():
        name = getattr(cls, "__name__", "")
        if name in DS_COMPUTE:
            new[cls] = t.wrap_compute(fn, name)
        elif name in DS_P2P:
            new[cls] = t.wrap_p2p(fn, name, DS_P2P[name])
        else:
            new[cls] = fn
    own = "_INSTRUCTION_MAP" not in getattr(engine, "__dict__", {})
    w._patcher.set(engine, "_INSTRUCTION_MAP", new)
    if own:
        w.add_close_callback(lambda: engine.__dict__.pop("_INSTRUCTION_MAP", None)
                             if engine.__dict__.get("_INSTRUCTION_MAP") is table else None)
    w.pipeline = t
    return t


def _unshadow(own: List[Any]) -> None:
    """After ``close()`` restored the patches (the Patcher sets an instance attribute back to the
    bound method it read): drop those instance attributes, so the class's methods show again."""
    for o, n in own:
        d = getattr(o, "__dict__", {})
        v = d.get(n)
        if v is not None and getattr(v, "__self__", None) is o and \
                getattr(v, "__func__", None) is getattr(type(o), n, None):
            del d[n]


def watch_stages(start: Callable[..., Any], obj: Any, optimizer: Any = None, loader: Any = None,
                 **kwargs: Any) -> Any:
    """``watch(schedule, optimizer, loader)``: ``start`` (``watcher.start``) times the optimizer's
    steps as in any loop, the model being the first local stage's module; ``attach`` adds the
    stage's pipeline measurements. A ``PipelineStage`` may stand for the schedule. Returns the
    Watcher (None when the hooks could not start)."""
    stages = stages_of(obj)
    model = getattr(stages[0], "submod", None) if stages else None
    w = start(model, optimizer, loader, **kwargs)
    if w is not None:
        try:
            if attach(w, obj) is not None:
                w.set_parallel("pipeline")  # the hello names the strategy (the stage's module is a plain one)
        except Exception as e:
            w._hook_error("pipeline setup", e)
    return w
