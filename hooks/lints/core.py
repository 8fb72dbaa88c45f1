"""The lints' shared machinery: settings, the store exchange, reporting, the lints thread."""
from __future__ import annotations

import itertools
import logging
import shutil
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch

from ranksight import catalog as C
from ranksight import protocol, triage

from .. import settings as hook_settings
from ..copysafe import CopySafe
from .facts import LoaderFacts, loader_facts

log = logging.getLogger("ranksight.hooks.lints")

LINT_IDS: Tuple[str, ...] = tuple(triage.LINTS)


TICK_SECONDS = 0.5


RESEND_SECONDS = 30.0


PEER_TIMEOUT = 600.0  # give up a cross-rank comparison when a peer has not published by then


MEMORY_FIRST_SECONDS = 1.0  # first workers' memory reading after the workers appear


MEMORY_FAST_CHECKS = 5


MEMORY_SECONDS = 10.0


DISK_SECONDS = 60.0


NUMA_SECONDS = 300.0


ROUND_QUIET_SECONDS = 5.0  # a checkpoint round ends at the next optimizer step or after this


BUCKETS = 256


PARAM_RTOL = 1e-6


_LOW_PRECISION = (torch.float16, torch.bfloat16)


_INSTANCES = itertools.count()  # watch() number in this process: keeps store keys of a second watch() apart


@dataclass(frozen=True)


class LintSettings:
    enabled: Mapping[str, bool]
    workers_host_mem_share: float
    min_free_bytes: float

    def on(self, lint: str) -> bool:
        return bool(self.enabled.get(lint, True))


def load_settings(config: Any = None) -> LintSettings:
    """The ``lints`` switches and the two lint thresholds, from the same config the watcher used
    (a path, a dict with sections, or None: ``RANKSIGHT_CONFIG`` and ``RANKSIGHT__lints__*``).
    A bad value never stops training: one log line and the default."""
    got = hook_settings.sections(config, ("lints", "thresholds"), who="lints", quiet_load=True,  # the watcher warned
                                 keys={"thresholds": ("lint_workers_host_mem_share", "lint_min_free_bytes")})
    thr = got["thresholds"]
    return LintSettings(enabled={k: bool(v) for k, v in got["lints"].items()},
                        workers_host_mem_share=float(thr["lint_workers_host_mem_share"]),
                        min_free_bytes=float(thr["lint_min_free_bytes"]))


class StoreGone(Exception):
    """The c10d store failed (the job is tearing down): the comparison is dropped quietly."""


class PeerExchange:
    """Publish/compare small values across ranks through the default process group's c10d store.

    Never blocks on a missing key (``check`` first, then ``get``); every call runs on the lints
    thread. Keys: ``ranksight/lints/<restart>/<watch no>/<name>/...``."""

    def __init__(self, restart: int, instance: int):
        self.prefix = f"ranksight/lints/{restart}/{instance}"

    @staticmethod
    def store() -> Any:
        """The default group's store, looked up per use: holding it would keep a destroyed process
        group's store (and rank 0's server thread) alive until interpreter exit."""
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return dist.distributed_c10d._get_default_store()
        except Exception as e:  # a process group without a store (or a torch without this helper)
            log.debug("ranksight: no c10d store for the lints' cross-rank checks: %s", e)
        return None

    def key(self, *parts: Any) -> str:
        return "/".join([self.prefix, *map(str, parts)])

    def _op(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as e:  # DistStoreError, RuntimeError, OSError: a store going away
            raise StoreGone(str(e)) from e

    def set(self, key: str, value: bytes) -> None:
        s = self.store()
        self._op(lambda: s.set(key, value))

    def ready(self, key: str) -> bool:
        s = self.store()
        return bool(self._op(lambda: s.check([key])))

    def get(self, key: str) -> bytes:
        s = self.store()
        return self._op(lambda: s.get(key))

    def add(self, key: str, n: int) -> int:
        s = self.store()
        return int(self._op(lambda: s.add(key, n)))


@dataclass


class _Task:
    """One pending cross-rank comparison, advanced by ``poll()`` on the lints thread."""
    name: str
    poll: Callable[[], bool]  # True when done
    deadline: float


REGISTRY: Dict[str, type] = {}  # lint id -> its mixin class (one module per lint)


def register(lint_id: str) -> Callable[[type], type]:
    """Class decorator of a lint's mixin: ``@register(C.LINT_X)``."""

    def deco(cls: type) -> type:
        if lint_id not in C.LINT_IDS:
            raise ValueError(f"unknown lint id {lint_id!r} (ranksight.catalog.LINT_IDS)")
        REGISTRY[lint_id] = cls
        cls.lint_id = lint_id  # type: ignore[attr-defined]
        return cls

    return deco


class LintsCore:
    """What every lint shares: state, reporting (``report``/``report_part``/``state``), the
    cross-rank store exchange, the forward pre-hook, the lints thread and its ``tick()``. The
    lints themselves are mixins registered by id (``register``); ``Lints`` combines them."""

    def __init__(self, watcher: Any, settings: LintSettings, *, sysfs: str = "/sys",
                 disk_usage: Callable[[str], Any] = shutil.disk_usage):
        self.w = watcher
        self.settings = settings
        self.sysfs = sysfs
        self.disk_usage = disk_usage
        self.instance = next(_INSTANCES)
        self._lock = threading.Lock()
        self._states: Dict[str, List[Any]] = {}  # lint -> [active, msg, key]
        self._parts: Dict[str, Dict[str, Optional[str]]] = {}  # lint -> part -> message (None: fine)
        self._stop = threading.Event()
        self._tick_lock = threading.Lock()  # tick() on the lints thread vs close()
        self._thread: Optional[threading.Thread] = None
        self._tasks: List[_Task] = []
        self._inbox: List[Callable[[], None]] = []  # work handed from the main thread to the lints thread
        self._ex = PeerExchange(watcher.identity.restart, self.instance)
        self.facts = loader_facts(watcher.loader) if watcher.loader is not None else LoaderFacts()
        # epoch / iterator
        self._epochs = 0
        self._last_epoch: Optional[int] = None
        self._iter_ref: Optional[weakref.ReferenceType] = None
        self._want_first_batch = False
        self._first_rows: Optional[int] = None
        # forward hook
        self._fwd_handle: Any = None
        self._fwd_count = 0
        self._digest_done = False
        self._batch_done = False
        # checkpoints
        self._ckpt_events: List[Tuple[int, float, str, Optional[str], Any]] = []
        self._round: Optional[Dict[str, Any]] = None
        self._ckpt_paths: Dict[str, float] = {}  # path -> last time seen
        self._largest_ckpt = 0
        self._last_round_paths: List[str] = []
        # periodic
        now = time.monotonic()
        self._next_resend = now + RESEND_SECONDS
        self._next_disk = now
        self._next_numa = now
        self._next_mem: Optional[float] = None
        self._node_contrib = 0  # bytes this rank added to the node's workers' counter
        self._mem_checks = 0
        self._joined = False
        self.evaluations: Dict[str, int] = {}  # lint -> times checked (tests wait on this)


    @property
    def rank(self) -> int:
        return self.w.identity.rank


    @property
    def world(self) -> int:
        return self.w.identity.world_size


    def on(self, lint: str) -> bool:
        return self.settings.on(lint)


    def report(self, lint: str, active: bool, msg: str = "", key: Any = None, info: bool = False) -> None:
        """Record a lint's state; log and send on a change (or a new ``key`` while active)."""
        if not self.on(lint):
            return
        line = f"ranksight lint {lint} on rank {self.rank}: {msg}"  # the log line keeps the whole message
        msg = msg[: protocol.MAX_MSG]
        with self._lock:
            self.evaluations[lint] = self.evaluations.get(lint, 0) + 1
            prev = self._states.get(lint)
            changed = prev is None or prev[0] != active or (active and prev[2] != key)
            self._states[lint] = [active, msg, key]
        if not changed:
            return
        if active:
            if info:
                self._line(logging.INFO, line)
            else:
                self._line(logging.WARNING, f"{line} (lints.{lint}: false turns this off)")
        elif prev is not None and prev[0]:
            self._line(logging.INFO, f"ranksight lint {lint} on rank {self.rank} cleared")
        self.w.send_lint(lint, active, msg)


    @staticmethod
    def _line(level: int, line: str) -> None:
        if logging.getLogger().hasHandlers() or log.hasHandlers():
            log.log(level, line)
        else:  # nothing configured: the line must still be seen (lastResort drops INFO)
            sys.stderr.write(line + "\n")
            sys.stderr.flush()


    def report_part(self, lint: str, part: str, msg: Optional[str], info: bool = False) -> None:
        """A lint made of several checks (``part``): active while any part has a message."""
        with self._lock:
            parts = self._parts.setdefault(lint, {})
            parts[part] = msg
            active = {k: v for k, v in parts.items() if v}
        if active:
            self.report(lint, True, "; ".join(active.values()), key=tuple(sorted(active)), info=info)
        else:
            self.report(lint, False)


    def state(self, lint: str) -> Optional[Tuple[bool, str]]:
        with self._lock:
            s = self._states.get(lint)
        return (s[0], s[1]) if s else None


    def idle(self) -> bool:
        """No cross-rank comparison, queued work or checkpoint round pending."""
        return not self._tasks and not self._inbox and self._round is None and not self._ckpt_events


    def _error(self, where: str, e: BaseException) -> None:
        self.w._hook_error(f"lint {where}", e)


    def start(self) -> None:
        for name, fn in ((C.LINT_IO_AMPLIFICATION, self._static_io), (C.LINT_UNEVEN_LAST_BATCH, self._static_uneven),
                         (C.LINT_RANK_DISAGREEMENT, self._static_seed)):
            if self.on(name):
                try:
                    fn()
                except Exception as e:
                    self._error(name, e)
        try:
            self._install_forward_hook()
        except Exception as e:
            self._error("forward hook", e)
        self._thread = threading.Thread(target=self._run, name="ranksight-lints", daemon=True)
        self._thread.start()


    def on_iter(self, it: Any) -> Optional[Callable[[Any], None]]:
        """The loader's iterator of an epoch: remember it (worker pids). Returns what the watch
        hands the epoch's first batch to: in the first epoch, when the lints need to look at it;
        else None. Never raises."""
        try:
            try:
                self._iter_ref = weakref.ref(it)
            except TypeError:
                self._iter_ref = None
            if self._epochs <= 1 and (self._want_first_batch or self.facts.batch_size is None):
                return self._first_batch
        except Exception as e:
            self._error("loader iterator", e)
        return None


    def _install_forward_hook(self) -> None:
        m = self.w.model
        if m is None or not hasattr(m, "register_forward_pre_hook"):
            return
        need_digest = self.world > 1 and self.on(C.LINT_RANK_DISAGREEMENT)
        need_batch = self.on(C.LINT_GLOBAL_BATCH_LR) and self.rank == 0
        self._digest_done = not need_digest
        self._batch_done = not need_batch
        if need_digest or need_batch:
            self._fwd_handle = m.register_forward_pre_hook(CopySafe(self._fwd_pre))


    def _fwd_pre(self, module: Any, args: Any) -> None:
        if not torch.is_grad_enabled():
            return None
        try:
            if not self.w._active:
                self._remove_fwd()
                return None
            if not self._digest_done:
                self._digest_done = True
                self._param_digest(module)
            if not self._batch_done:
                if self.w._seq >= 1:
                    self._batch_done = True
                    self._global_batch(self._fwd_count)
                else:
                    self._fwd_count += 1
            if self._digest_done and self._batch_done:
                self._remove_fwd()
        except Exception as e:
            self._digest_done = self._batch_done = True
            self._remove_fwd()
            self._error("forward pre-hook", e)
        return None


    def _remove_fwd(self) -> None:
        h, self._fwd_handle = self._fwd_handle, None
        if h is not None:
            h.remove()  # safe inside the hook: Module._call_impl iterates over a copy of its hooks


    def _compare_with_peer(self, name: str, own: bytes, result: Callable[[bytes, bytes, int], None]) -> None:
        """Publish ``own``; when the peer (rank 0, or rank 1 for rank 0) has published, call
        ``result(own, peer_value, peer_rank)`` on the lints thread."""
        if self.world <= 1:
            return
        peer = 1 if self.rank == 0 else 0
        st = {"published": False}

        def poll() -> bool:
            if self._ex.store() is None:
                return False
            if not st["published"]:
                self._ex.set(self._ex.key(name, self.rank), own)
                st["published"] = True
            k = self._ex.key(name, peer)
            if not self._ex.ready(k):
                return False
            result(own, self._ex.get(k), peer)
            return True

        self._add_task(name, poll)


    def _count_equal(self, name: str, value: str, result: Callable[[int, int], None]) -> None:
        """Count the ranks that publish the same ``value``; ``result(same, world)`` once all have."""
        if self.world <= 1:
            return
        st = {"published": False}
        total = self.world

        def poll() -> bool:
            if self._ex.store() is None:
                return False
            done_key = self._ex.key(name, "n")
            if not st["published"]:
                self._ex.add(self._ex.key(name, "v", value), 1)
                self._ex.add(done_key, 1)
                st["published"] = True
            if self._ex.add(done_key, 0) < total:
                return False
            result(self._ex.add(self._ex.key(name, "v", value), 0), total)
            return True

        self._add_task(name, poll)


    def _add_task(self, name: str, poll: Callable[[], bool]) -> None:
        self._inbox.append(lambda: self._tasks.append(_Task(name, poll, time.monotonic() + PEER_TIMEOUT)))


    def _run(self) -> None:
        # the first tick at once: the checks "at start" (disk headroom, NUMA binding) then see the
        # job before its first steps and checkpoints, however fast those come
        while not self._stop.is_set():
            if self.w._closed:
                break
            with self._tick_lock:
                try:
                    self.tick(time.monotonic())
                except Exception as e:
                    self._error("thread", e)
            if self._stop.wait(TICK_SECONDS):
                break
        try:
            self._leave_node()
        except Exception as e:
            self._error("thread exit", e)


    def close(self) -> None:
        """The watch ends (``Watcher.close``, usually on the main thread): judge a checkpoint round
        still open (the final save of a run; its lint record still goes out with the watcher's
        final flush), remove the forward hook, stop the thread (waiting for it at most a second more)."""
        self._stop.set()
        if self._tick_lock.acquire(timeout=1.0):
            try:
                if self.on(C.LINT_INCOMPLETE_CHECKPOINT) and (self._ckpt_events or self._round is not None):
                    self._checkpoint_rounds(time.monotonic())
                    self._end_round()
            except Exception as e:
                self._error("close", e)
            finally:
                self._tick_lock.release()
        try:
            self._remove_fwd()
        except Exception as e:
            self._error("close", e)
        t = getattr(self, "_thread", None)
        if t is not None and t.is_alive() and t is not threading.current_thread():
            t.join(timeout=1.0)  # it wakes every TICK_SECONDS and sees the stop: the watch leaves no thread


    def tick(self, now: float) -> None:
        while self._inbox:
            try:
                self._inbox.pop(0)()
            except Exception as e:
                self._error("queued work", e)
        for t in list(self._tasks):
            try:
                done = t.poll()
            except StoreGone as e:
                log.debug("ranksight: lint comparison %s dropped: %s", t.name, e)
                done = True
            except Exception as e:
                self._error(f"comparison {t.name}", e)
                done = True
            if done or now > t.deadline:
                self._tasks.remove(t)
        if self._ckpt_events or self._round is not None:
            self._checkpoint_rounds(now)
        if now >= self._next_numa:
            self._next_numa = now + NUMA_SECONDS
            if self.on(C.LINT_NUMA_BINDING):
                try:
                    self.check_numa()
                except Exception as e:
                    self._error(C.LINT_NUMA_BINDING, e)
        if now >= self._next_disk:
            self._next_disk = now + DISK_SECONDS
            if self.on(C.LINT_DISK_HEADROOM):
                try:
                    self.check_disk()
                except Exception as e:
                    self._error(C.LINT_DISK_HEADROOM, e)
        if self.on(C.LINT_DATALOADER_WORKERS_RSS):
            self._memory_tick(now)
        if not self._batch_done and self._fwd_handle is None and self.w._seq >= 1:
            self._batch_done = True  # no model to hook: no accumulation count
            if self.on(C.LINT_GLOBAL_BATCH_LR) and self.rank == 0:
                self._global_batch(1)
        if now >= self._next_resend:
            self._next_resend = now + RESEND_SECONDS
            with self._lock:
                states = [(k, v[0], v[1]) for k, v in self._states.items()]
            for k, active, msg in states:
                self.w.send_lint(k, active, msg)
