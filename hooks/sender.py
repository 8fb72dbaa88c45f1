"""The background thread of a ``Watcher`` ("ranksight-hb"): turns queued step tuples into
"steps" datagrams, sends heartbeats, probes the main thread, sends its stack when it makes no
progress, prints the rank-0 table and reads CUDA allocator stats and the Flight Recorder."""
from __future__ import annotations

import logging
import sys
import time
from operator import itemgetter
from typing import Any, Dict, List, Optional, Tuple

import torch

from ranksight import protocol

from . import flops, forksafe, selfcheck, stack
from .memory import FIELDS as MEMORY_FIELDS, AllocatorReader
from .identity import Identity
from .table import emit as table_emit, make_table
from .timing import drain
from .transport import Transport

log = logging.getLogger("ranksight.hooks")
_perf = time.perf_counter


TICK_SECONDS = 0.25  # the background thread's period
# automatic sampled timing: the hello (with its steps per timed step) is sent again when the mean
# gap moved, at most this often
HELLO_EVERY_MIN_S = 30.0


# CUDA: the newest step record waits this long (or for the next one) while GPU intervals are still
# pending, so that close() can add the last steps' GPU times to it (see close())
HOLD_SECONDS = 1.0


# The step record's layout, from its declaration (ranksight/record.py): a queued step tuple holds
# the per-step fields at LAYOUT.index[key] (see StepPath._step_end), the same in every version.
# The "steps" records are encoded by the watch's ``_layout``, the version and step detail its
# settings name (hooks.protocol, hooks.step_detail); the values a record carries once, at its last
# step (``_layout.last``), are read from step_state().
LAYOUT = protocol.LAYOUTS[protocol.VERSION]
_DUR, _DATA, _COMM, _XCOMM, _CKPT = (LAYOUT.index[k] for k in ("dur", "data", "comm", "xcomm", "ckpt"))


STEPS_PER_RECORD = protocol.STEPS_MAX  # at most this many steps per "steps" record (the agent's cap); a record
# over protocol.MAX_DATAGRAM bytes is sent as the fewest parts of equal steps that fit (_send_steps)


def enc_fields(fields: Dict[str, Any]) -> str:
    """``{"tot": ..., "hist": ...}`` as the JSON members of a record (no braces)."""
    return protocol.encode(fields).decode()[1:-1]


def _process_start() -> float:
    """Unix time this process started (0.0 when unknown)."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:
        return 0.0


def _gpu_uuid(device: Any) -> str:
    """The CUDA device's UUID as NVML prints it ("GPU-xxxxxxxx-..."); "" when unknown."""
    try:
        u = str(torch.cuda.get_device_properties(device).uuid)
    except Exception:
        return ""
    u = u.strip()
    if not u:
        return ""
    return u if u.upper().startswith(("GPU-", "MIG-")) else "GPU-" + u



class Background:
    """The background thread's side of ``Watcher`` (a mixin: the state is set up in
    ``Watcher.__init__``). It takes queued records and sends them under ``_send_lock``."""

    cuda_api: Any = None  # what the allocator's counters are read through (None: torch.cuda; tests: a stand-in)

    def _run(self) -> None:
        try:
            with forksafe.working():  # a fork waits for the start and each tick (see forksafe.py)
                self._transport = Transport(self.settings.agent)
                self._bg_start()
            while not self._stop.wait(self._tick_s):
                try:
                    with forksafe.working():
                        self._tick()
                except Exception as e:
                    self._hook_error("heartbeat thread", e)
        except Exception as e:
            self._hook_error("heartbeat thread start", e)

    def _bg_start(self) -> None:
        self._wall0, self._pc0 = time.time(), _perf()
        self._hb_seq = 0
        self._next_hb = _perf()
        self._last_sig: Tuple[Any, ...] = ()
        self._last_progress = _perf()
        self._mem = dict.fromkeys(MEMORY_FIELDS, 0)  # the allocator's stats, by field key (hooks/memory.py)
        self._alloc: Optional[AllocatorReader] = None
        self._wrss = 0
        self._next_wrss = 0.0
        now = _perf()
        st = self.settings
        self._table = make_table(st.table_every_steps, st.table_every_seconds, now, st.table_min_seconds,
                                 st.table_share_move) if self.identity.rank == 0 else None
        self._set_identity(self.identity)
        d = selfcheck.dirs(self.settings.log_dir, self.settings.checkpoint_dir)
        info = selfcheck.collect(d, self.backend)
        fpt = ""
        try:  # FLOPs per token, once: declared, or the parameters counted now (hooks/flops.py)
            self._flops = flops.FlopsPerToken(self.settings.flops_per_token, self.model)
            info.update(self._flops.info())
            fpt = "; " + self._flops.describe()
        except Exception as e:
            self._hook_error("FLOPs per token", e)
        par = dict(self.parallel)
        info.update(par)
        self._hello_parallel = par
        self._hello_every, self._hello_due = 0, 0.0  # the last hello's gpu_every; when the next may go out
        self.selfcheck = info
        self._hello_dirs = d
        line = "ranksight: self-check rank %d: %s%s; agent %s; %s" % (
            self.identity.rank, selfcheck.describe(info), fpt, self.settings.agent, self.identity.job_line())
        if self.identity.local_rank == 0:
            if logging.getLogger().hasHandlers():
                log.info(line)
            else:
                sys.stderr.write(line + "\n")
        self._send_hello()

    def _send_hello(self) -> None:
        try:
            every = self._tl.every if self._tl is not None else 0
            rec = dict(self._base, t="hello", ts=time.time(), info=dict(self.selfcheck), dirs=self._hello_dirs,
                       pstart=round(_process_start(), 3),
                       gpu=_gpu_uuid(self._tl.device) if self._tl is not None else "", gpu_every=every)
            self._hello_every = every
            self._hello_due = _perf() + HELLO_EVERY_MIN_S
            self._transport.send(selfcheck.fit(rec))
        except Exception as e:
            self._hook_error("hello record", e)

    def _hello_again(self) -> None:
        """The watch learned how its model is parallelized after the hello went out (a model
        discovery found, ``set_parallel``), or automatic sampled timing moved its mean gap (at most
        once each ``HELLO_EVERY_MIN_S``): the hello is sent again with it (the agent keeps the
        latest hello's info and steps per timed step)."""
        par = self.parallel
        if par == self._hello_parallel:
            tl = self._tl
            if tl is not None and tl.auto and tl.every != self._hello_every and _perf() >= self._hello_due:
                self._send_hello()
            return
        par = dict(par)
        self._hello_parallel = par
        self.selfcheck.update(par)
        self._send_hello()

    def _tick(self) -> None:
        now = _perf()
        self._hello_again()
        self._probe(now)
        self._stack(now)
        self._flush()
        if now >= self._next_hb:
            self._next_hb = now + self.settings.heartbeat_seconds
            self._heartbeat(now)
        if self._table is not None and self._table.due(now):
            self._print_table()
        for p in self._periodic:
            if now >= p[2]:
                p[2] = now + p[1]
                try:
                    p[0]()
                except Exception as e:
                    self._hook_error(f"periodic {getattr(p[0], '__name__', p[0])}", e)

    def _print_table(self) -> None:
        now = _perf()
        text = self._table.render(self.identity.job, now)  # type: ignore[union-attr]
        self._table.reset(now)  # type: ignore[union-attr]
        table_emit(text)  # whole lines, one write, under the hooks' console lock

    def _probe(self, now: float) -> None:
        f = sys._current_frames().get(self._main_tid)
        sig = (id(f), f.f_lineno if f is not None else -1, f.f_lasti if f is not None else -1,
               self._seq, self._phase_t)
        del f
        if sig != self._last_sig:
            self._last_sig = sig
            self._last_progress = now

    def _stack(self, now: float) -> None:
        """The main thread's stack once it made no progress for stack_after_seconds (hooks/stack.py)."""
        try:
            sw = getattr(self, "_stack_watch", None)
            if sw is None:
                sw = self._stack_watch = stack.StackWatch(self._main_tid, self.settings.stack_after_seconds,
                                                          self.settings.stack_every_seconds)
                self._stack_seq = (self._seq, now)
            if self._seq != self._stack_seq[0]:
                self._stack_seq = (self._seq, now)
            idle = now - self._last_progress
            if self._seq > 0:
                idle = max(idle, now - self._stack_seq[1])
            body = sw.tick(now, idle, self._phase, lambda: self._collective_waiting(now))
            if body is not None and not self._bye_sent:
                self._transport.send(stack.fit(dict(self._base, t="stack", ts=time.time()), body))
        except Exception as e:
            self._hook_error("stack", e)

    def _collective_waiting(self, now: float) -> Optional[Dict[str, Any]]:
        """Where the blocked rank waits: from the Flight Recorder (every collective of every group,
        DDP's C++ ones too, with the group's sequence number), told which op the wrappers see the
        rank blocked in (FlightRecorder.waiting); else the wrappers' own."""
        wrapped = self.comm.waiting(now)
        if self._fr_status is not None:
            try:
                got = self._fr_status.waiting(wrapped["op"] if wrapped is not None else "")
                if got is not None:
                    return got
            except Exception as e:
                self._hook_error("Flight Recorder position", e)
        return wrapped

    def _set_identity(self, ident: Identity) -> None:
        self.identity = ident
        # the "steps" encoder of the version and step detail the settings name (the totals are alike in both)
        self._layout = lay = protocol.SENDER_LAYOUTS[self.settings.protocol, self.settings.step_detail]
        self._base = dict(ident.base(), v=lay.version, sess=self.sess)
        self._last = itemgetter(*lay.last)
        # Step records are formatted from a template: 4x cheaper than json.dumps of a dict, and
        # valid JSON as long as every number is finite and non-negative (checked per record).
        self._steps_prefix = protocol.encode(dict(self._base, t="steps")).decode()[:-1] + ","

    def _take_items(self) -> List[tuple]:
        """The queued records, the held-back step record first (background thread, or close())."""
        items = drain(self._queue)
        held = self._held
        if held is not None:
            self._held = None
            items.insert(0, held)
        return items

    def _flush(self) -> None:
        """Send what is queued: each tick's steps in records of as many as a datagram holds."""
        with self._send_lock:  # close() flushes under it too: a record is held, sent or taken, never lost
            if self._bye_sent:
                return
            items = self._take_items()
            if not items:
                return
            tl = self._tl
            if tl is not None and not tl.sampled and tl.pending and not self._stop.is_set():
                # hold back the newest step record while GPU intervals are pending: if the watch ends
                # soon, close() adds the intervals it still resolves to it (else they would be lost;
                # sampled timing adds none: the shares stand for them)
                for i in range(len(items) - 1, -1, -1):
                    if items[i][0] == "step":
                        if _perf() - items[i][2] < HOLD_SECONDS:
                            self._held = items.pop(i)
                        break
            self._send_items(items)

    def _send_items(self, items: List[tuple]) -> None:
        """Send queued records in order. Consecutive step records go out as "steps" records (up
        to STEPS_PER_RECORD steps each and MAX_DATAGRAM bytes, with the totals after their last
        step): one datagram per tick per rank while a tick's steps fit in one, not one per step."""
        if not items:
            return
        send, enc = self._transport.send, protocol.encode
        table = self._table
        totals = self.totals
        batch: List[tuple] = []
        for it in items:
            try:
                if it[0] == "step":
                    seq = it[1]
                    if table is not None:
                        table.add(seq, it[_DUR], it[_DATA], it[_COMM], it[_XCOMM], it[_CKPT])
                        if table.due(_perf()):
                            self._print_table()
                    if batch and (seq != batch[-1][1] + 1 or len(batch) >= self._steps_fill):
                        self._send_steps(batch)
                        batch = []
                    batch.append(it)
                    continue
                if batch:
                    self._send_steps(batch)
                    batch = []
                rec = dict(self._base, ts=it[1])
                rec.update(it[2])
                send(enc(rec))
                if it[0] == "ckpt":
                    c = it[2]
                    totals.checkpoint(it[1], c["dur"], c["bytes"], c["ok"])
            except (ValueError, TypeError) as e:  # a NaN or a bad type: our bug, count it
                self._hook_error("record encoding", e)
        if batch:
            self._send_steps(batch)

    def _send_steps(self, batch: List[tuple]) -> None:
        """One "steps" record for consecutive step tuples (split in two while it is too big)."""
        lay = self._layout
        try:
            lists = lay.encode_lists(batch)
        except (ValueError, TypeError) as e:  # our bug: counted; these steps stay out of the totals too
            self._hook_error("record encoding", e)
            return
        totals = self.totals
        for it in batch:
            totals.step(it)
        try:
            data = lay.encode_steps(self._steps_prefix, self._wall0 + (batch[-1][2] - self._pc0), batch[0][1], lists,
                                    self._last(self.step_state()), enc_fields(totals.fields())).encode()
        except (ValueError, TypeError) as e:
            self._hook_error("record encoding", e)
            return
        # how many steps a datagram holds, by this record's bytes per step (the fixed part, identity
        # and totals, counted once): consecutive steps go out in records of that many
        fit = self._steps_fill = protocol.steps_fill(len(data), len(data) - len(lists) + lay.lists_fixed,
                                                     len(batch))
        if len(data) > protocol.MAX_DATAGRAM and len(batch) > 1:  # (the totals were added: take them back)
            for it in batch:
                totals.step(it, -1)
            # the fewest parts of equal steps that fit; a part still too big splits again
            parts = min(len(batch), max(2, -(-len(batch) // fit)))
            size = -(-len(batch) // parts)
            for i in range(0, len(batch), size):
                self._send_steps(batch[i:i + size])
            return
        self._transport.send(data)

    def step_state(self) -> Dict[str, int]:
        """The step record's cumulative and current fields now, by key (sent once per record)."""
        state = dict(self._mem)
        lr = self.losses
        state.update(herr=self.herr, hdrop=(self._tl.dropped if self._tl is not None else 0) + lr.dropped,
                     wrss=self._wrss, restart=self.identity.restart, fpt=self._fpt(), lnan=lr.nonfinite,
                     lnanstep=lr.first_bad, pstage=self._pipe[0], pstages=self._pipe[1], pmb=self._pipe[2],
                     total=self.total_steps)
        r = self.resumes.last  # a checkpoint restore (hooks/resume.py)
        state.update(resumed=int(r.at) if r is not None else 0, rstep=r.step if r is not None else 0)
        return state

    def _fpt(self) -> int:
        """The step records' "fpt": FLOPs per token, its attention term completed once the first
        batch with tokens gave the sequence length; a model discovered after watch() is counted once."""
        fl = self._flops
        if fl is None:
            return 0
        if not fl.had_model and not fl.declared and self.model is not None:
            try:
                fl = self._flops = flops.FlopsPerToken(0, self.model)
            except Exception as e:
                self._hook_error("FLOPs per token", e)
                fl.had_model = True  # (counted as one error: not tried again)
                return 0
        return fl.value(self._seq_len)

    def _heartbeat(self, now: float) -> None:
        if not self.identity.from_pg:
            self._refresh_identity()
        if self._tl is not None:
            self._read_cuda_memory()
        if self.settings.patch_torch_save and not self._dcp_patched and self._active:
            self._dcp_patched = self.ckpt.install_dcp(self._patcher)
        if now >= self._next_wrss:
            self._next_wrss = now + 5.0
            self._read_worker_rss()
        coll = self.comm.oldest_inflight(now)
        if self._fr_status is not None:
            try:
                coll = max(coll, self._fr_status.inflight_age(now))
            except Exception as e:
                self._hook_error("Flight Recorder status", e)
        if self._fr is not None and self._fr.poll_due(now):
            try:
                durs, age = self._fr.poll_timed(now)
                if self._fr_on:
                    if durs:
                        self.comm.add_flight_recorder(durs)
                elif durs:  # these collectives were timed by events; later ones come from the recorder
                    self.comm.comm_events = False
                    self._fr_on = True
                coll = max(coll, age)
            except Exception as e:
                self._hook_error("NCCL Flight Recorder", e)
        self._hb_seq += 1
        rec = dict(self._base, t="hb", ts=time.time(), seq=self._hb_seq, every=self.settings.heartbeat_seconds,
                   step=self._seq, phase=self._phase, coll=round(coll, 6),
                   probe=round(max(0.0, now - self._last_progress), 6), herr=self.herr,
                   pdur=round(max(0.0, now - self._phase_t), 6), **self.totals.fields())
        try:
            data = protocol.encode(rec)
        except (ValueError, TypeError) as e:
            self._hook_error("heartbeat encoding", e)
            return
        with self._send_lock:  # its totals cover the records sent before it; none after the bye
            if not self._bye_sent:
                self._transport.send(data)

    def _refresh_identity(self) -> None:
        ident = Identity.detect()
        if ident.from_pg:
            self._set_identity(ident)
            self.backend = self._backend()

    def _read_cuda_memory(self) -> None:
        """The allocator's counters and peaks (host-side, no device sync; hooks/memory.py)."""
        try:
            now = _perf()
            r = self._alloc
            if r is None or r.device != self._tl.device:  # type: ignore[union-attr]
                r = self._alloc = AllocatorReader(self.cuda_api or torch.cuda, self._tl.device,  # type: ignore[union-attr]
                                                  self.settings.memory_peak_seconds, now)
            self._mem = r.read(now)
        except Exception as e:
            self._hook_error("CUDA memory stats", e)

    def _read_worker_rss(self) -> None:
        if int(getattr(self.loader, "num_workers", 0) or 0) <= 0:
            return
        try:
            import psutil

            total = 0
            for c in psutil.Process().children(recursive=False):
                try:
                    total += c.memory_info().rss
                except psutil.Error:
                    pass
            self._wrss = total
        except Exception as e:
            self._hook_error("worker RSS", e)
