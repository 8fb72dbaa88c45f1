"""The disk_headroom lint: too little free disk for the next checkpoints."""
from __future__ import annotations

import os
import tempfile
from typing import List, Optional, Set, Tuple

from ranksight import catalog as C
from ranksight.common import units

from .core import register


@register(C.LINT_DISK_HEADROOM)
class DiskHeadroom:
    """disk_headroom: too little free disk for the next checkpoints.

    A mixin of ``Lints``: its state is set up in ``LintsCore.__init__``; when it runs is in
    the ``ranksight.hooks.lints`` docstring."""

    def _dirs(self) -> List[Tuple[str, str]]:
        out: List[Tuple[str, str]] = []
        s = self.w.settings
        if self.w.identity.local_rank == 0:
            out.append(("tmp", tempfile.gettempdir()))
            if s.log_dir:
                out.append(("log", s.log_dir))
            if s.checkpoint_dir:
                out.append(("checkpoint", s.checkpoint_dir))
        for p in list(self._ckpt_paths):
            d = p if os.path.isdir(p) else os.path.dirname(p)
            out.append(("checkpoint", d))
        return out


    def _free(self, path: str) -> Optional[int]:
        p = os.path.abspath(path)
        while not os.path.exists(p):  # a directory not created yet: its parent's filesystem
            parent = os.path.dirname(p)
            if parent == p:
                return None
            p = parent
        try:
            return int(self.disk_usage(p).free)
        except OSError:
            return None


    def check_disk(self) -> None:
        self._measure_checkpoints()
        dirs = self._dirs()
        if not dirs:
            return
        largest = self._largest_ckpt
        need = 2 * largest if largest > 0 else self.settings.min_free_bytes
        low: List[str] = []
        seen: Set[Tuple[str, str]] = set()
        for kind, d in dirs:
            if (kind, d) in seen:
                continue
            seen.add((kind, d))
            free = self._free(d)
            if free is not None and free < need:
                low.append(f"{kind} {d} has {units.size(free)} free")
        if low:
            rule = (f"2 x the largest checkpoint ({units.size(largest)})" if largest > 0 else
                    f"thresholds.lint_min_free_bytes before the first checkpoint")
            self.report(C.LINT_DISK_HEADROOM, True,
                        f"less free space than {rule} = {units.size(need)}: {'; '.join(low)}; the next checkpoint or log "
                        "write can fail (or leave a truncated checkpoint)", key=tuple(sorted(x.split(" has ")[0] for x in low)))
        else:
            self.report(C.LINT_DISK_HEADROOM, False)
