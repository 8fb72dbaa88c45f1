"""The dataloader_workers_rss lint: DataLoader workers hold too much host memory."""
from __future__ import annotations

import os
from typing import List, Sequence, Tuple

from ranksight import catalog as C
from ranksight.common import units

from .core import MEMORY_FAST_CHECKS, MEMORY_FIRST_SECONDS, MEMORY_SECONDS, StoreGone, log, register


@register(C.LINT_DATALOADER_WORKERS_RSS)
class DataloaderWorkersRss:
    """dataloader_workers_rss: DataLoader workers hold too much host memory.

    A mixin of ``Lints``: its state is set up in ``LintsCore.__init__``; when it runs is in
    the ``ranksight.hooks.lints`` docstring."""

    def worker_pids(self) -> List[int]:
        it = self._iter_ref() if self._iter_ref is not None else None
        workers = getattr(it, "_workers", None) if it is not None else None
        if not workers:
            return []
        return [int(p.pid) for p in workers if getattr(p, "pid", None)]


    def _memory_tick(self, now: float) -> None:
        pids = self.worker_pids()
        if not pids:
            self._next_mem = None
            if self._node_contrib:
                try:
                    self._leave_node()
                except Exception as e:
                    self._error(C.LINT_DATALOADER_WORKERS_RSS, e)
            return
        if self._next_mem is None:
            self._mem_checks = 0
            self._next_mem = now + MEMORY_FIRST_SECONDS
            return
        if now < self._next_mem:
            return
        # the first MEMORY_FAST_CHECKS a second apart (workers start, the node's sum settles once
        # every rank has published), then every MEMORY_SECONDS
        self._mem_checks += 1
        self._next_mem = now + (MEMORY_FIRST_SECONDS if self._mem_checks < MEMORY_FAST_CHECKS else MEMORY_SECONDS)
        try:
            self.check_workers_memory(pids)
        except StoreGone as e:
            log.debug("ranksight: workers' memory: store gone: %s", e)
        except Exception as e:
            self._error(C.LINT_DATALOADER_WORKERS_RSS, e)


    @staticmethod
    def _memory_budget(sysfs: str = "/sys") -> Tuple[int, str]:
        import psutil

        total = int(psutil.virtual_memory().total)
        what = "host memory"
        try:  # cgroup v2 (then v1) limit of this process, when lower than the host's memory
            with open("/proc/self/cgroup") as fh:
                lines = fh.read().splitlines()
            for line in lines:
                hid, ctrl, path = line.split(":", 2)
                if hid == "0":
                    p = os.path.join(sysfs, "fs/cgroup", path.lstrip("/"), "memory.max")
                elif "memory" in ctrl.split(","):
                    p = os.path.join(sysfs, "fs/cgroup/memory", path.lstrip("/"), "memory.limit_in_bytes")
                else:
                    continue
                try:
                    with open(p) as fh:
                        v = fh.read().strip()
                except OSError:
                    continue
                if v.isdigit() and 0 < int(v) < total:
                    total, what = int(v), "the cgroup's memory limit"
        except (OSError, ValueError):
            pass
        return total, what


    def check_workers_memory(self, pids: Sequence[int]) -> None:
        import psutil

        uss = rss = 0
        alive = 0
        for pid in pids:
            try:
                mi = psutil.Process(pid).memory_full_info()
            except (psutil.Error, OSError):
                continue
            alive += 1
            uss += int(getattr(mi, "uss", 0))
            rss += int(mi.rss)
        if not alive:
            return
        budget, what = self._memory_budget(self.sysfs)
        limit = self.settings.workers_host_mem_share * budget
        node_total, how, settled = self._node_total(uss, budget)
        share = node_total / budget if budget else 0.0
        if not settled and self._mem_checks < MEMORY_FAST_CHECKS:
            return  # the node's other ranks have not published yet: report the node's sum once they have
        if node_total > limit:
            self.report(C.LINT_DATALOADER_WORKERS_RSS, True,
                        f"DataLoader workers on node {self.w.identity.node} hold {units.size(node_total)} of private memory "
                        f"({how}; this rank's {alive} workers: {units.size(uss)} private, {units.size(rss)} RSS) = {share:.0%} of "
                        f"{what} {units.size(budget)}, above thresholds.lint_workers_host_mem_share "
                        f"{self.settings.workers_host_mem_share:.0%}: lower num_workers/prefetch_factor, or keep samples "
                        "in numpy/torch arrays instead of Python lists/dicts (workers copy the pages they touch)",
                        key="over")
        elif node_total < 0.9 * limit or self.state(C.LINT_DATALOADER_WORKERS_RSS) is None:
            self.report(C.LINT_DATALOADER_WORKERS_RSS, False)


    def _node_total(self, own: int, budget: int) -> Tuple[int, str, bool]:
        """The node's total private memory of all ranks' workers: exact through the store (each
        rank adds its change to a per-node counter), else LOCAL_WORLD_SIZE x own. The flag says
        whether the sum is settled: every local rank (LOCAL_WORLD_SIZE, when set) has published."""
        lws = 1
        try:
            lws = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        except ValueError:
            pass
        if self.world > 1 and self._ex.store() is not None:
            key = self._ex.key("wmem", self.w.identity.node)
            delta = own - self._node_contrib
            total = self._ex.add(key, delta)
            self._node_contrib = own
            n = self._ex.add(self._ex.key("wmem-ranks", self.w.identity.node), 0 if self._joined else 1)
            self._joined = True
            return max(total, own), f"summed over the {n} rank(s) of this node that ran workers", n >= lws
        if lws == 1:
            return own, "this rank only", True
        return own * lws, f"estimated as {lws} local ranks x this rank's (no process group store)", True


    def _leave_node(self) -> None:
        """Take this rank's workers out of the node's counter when the watch ends."""
        if self._node_contrib and self._ex.store() is not None:
            try:
                self._ex.add(self._ex.key("wmem", self.w.identity.node), -self._node_contrib)
                self._node_contrib = 0
            except StoreGone:
                pass
