"""The runbook prose of the triage table: Meaning, Impact, Diagnosis and Mitigation of each entry,
kept as Markdown in prose/<entry id>.md (prose/lint.md for every setup lint). A paragraph may wrap
over lines (they join with one space); ``{NAME}`` is a catalog metric name (``{RANK_STALL_WHERE}``)
or a value the caller passes (``{what}``)."""
from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Dict

from .. import catalog as C

PROSE_DIR = Path(__file__).resolve().parent / "prose"
SECTIONS = ("meaning", "impact", "diagnosis", "mitigation")
_NAME = re.compile(r"\{(\w+)\}")


@lru_cache(maxsize=None)
def _sections(stem: str) -> Dict[str, str]:
    text = (PROSE_DIR / f"{stem}.md").read_text(encoding="utf-8")
    out: Dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = line[3:].strip().lower()
            out[current] = ""
        elif current and line.strip():
            out[current] = f"{out[current]} {line.strip()}" if out[current] else line.strip()
    if tuple(out) != SECTIONS:
        raise ValueError(f"{PROSE_DIR / stem}.md: sections {tuple(out)}, expected {SECTIONS}")
    return out


def prose(stem: str, **values: str) -> Dict[str, str]:
    """The four sections of prose/<stem>.md as Entry keyword arguments, ``{NAME}`` filled from
    ``values`` or the catalog."""
    def fill(m: "re.Match[str]") -> str:
        name = m.group(1)
        return values[name] if name in values else str(getattr(C, name))

    return {k: _NAME.sub(fill, v) for k, v in _sections(stem).items()}
