"""disk: free and total bytes of the filesystems under watched paths.

Watched: the system temp dir, every --watch-path / agent.watch_paths entry, and
the tmp/log/checkpoint dirs ranks report in their "hello" record. A path that
does not exist yet (a checkpoint dir created at the first save) is measured on
its nearest existing parent: the filesystem it will be written to.
Free bytes are those available to non-root users (statvfs f_bavail), like df.
"""
from __future__ import annotations

import logging
import os
import tempfile
from typing import Callable, Iterable, List, Optional, Set

from ranksight import catalog as C

from . import Context, Family, PartialError, family, register

log = logging.getLogger("ranksight.exporter.disk")


def existing_ancestor(path: str) -> Optional[str]:
    p = os.path.abspath(path)
    while True:
        if os.path.exists(p):
            return p
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


class DiskCollector:
    name = "disk"

    def __init__(self, node: str, paths: Iterable[str] = (), reported: Callable[[], Set[str]] = set,
                 include_tmp: bool = True):
        self.node = node
        base = [tempfile.gettempdir()] if include_tmp else []
        self.paths = sorted({os.path.normpath(os.path.abspath(p)) for p in list(base) + list(paths)})
        self.reported = reported

    def watched(self) -> List[str]:
        return sorted(set(self.paths) | set(self.reported()))

    def collect(self) -> List[Family]:
        node = [self.node]
        f_free, f_total = family(C.DISK_FREE), family(C.DISK_TOTAL)
        problems = []
        for path in self.watched():
            target = existing_ancestor(path)
            try:
                if target is None:
                    raise FileNotFoundError(path)
                st = os.statvfs(target)
            except OSError as e:
                problems.append(f"statvfs {path}: {e.strerror or e}")
                continue
            f_free.add_metric(node + [path], st.f_bavail * st.f_frsize)
            f_total.add_metric(node + [path], st.f_blocks * st.f_frsize)
        fams = [f_free, f_total]
        if problems:
            raise PartialError("; ".join(problems), fams)
        return fams


@register("disk")
def _build(ctx: Context) -> DiskCollector:
    """The watched paths, plus the directories the ranks reported (with the ranks collector)."""
    reported = ctx.table.watched_dirs if ctx.table is not None else set
    return DiskCollector(ctx.settings.node, ctx.settings.watch_paths, reported)
