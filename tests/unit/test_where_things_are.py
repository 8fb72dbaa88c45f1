"""CONTRIBUTING.md's "Where things are" map names folders and files that exist, and every folder of
the tree is on it: a folder moved or removed, or a new one nobody mapped, fails here."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[2]
MAP_TITLE = "## Where things are"
# tracked folders at these depths must be on the map (deeper ones belong to their parent's row)
MAPPED_ROOTS = ("ranksight", "hooks", "exporter", "bench", "tests")


def _rows(text: str) -> Dict[str, str]:
    """The map's table: each folder cell (one or more `folder/`, comma separated) -> its row's text."""
    section = text.split(MAP_TITLE, 1)[1].split("\n## ", 1)[0]
    rows: Dict[str, str] = {}
    for line in section.splitlines():
        m = re.match(r"^\| (`[^|]+`) \| (.+) \|$", line)
        if m:
            for folder in re.findall(r"`([^`]+)`", m.group(1)):
                rows[folder] = m.group(2)
    return rows


def _folders(pattern: str) -> List[Path]:
    return sorted(p for p in REPO.glob(pattern.rstrip("/")) if p.is_dir())


def _tracked_folders() -> List[str]:
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    dirs = set()
    for f in files.splitlines():
        parts = f.split("/")[:-1]
        if not parts or parts[0].startswith("."):
            continue
        dirs.add(parts[0] + "/")
        if len(parts) > 1 and parts[0] in MAPPED_ROOTS:
            dirs.add("/".join(parts[:2]) + "/")
    return sorted(dirs)


def _covered(folder: str, rows: Dict[str, str]) -> bool:
    """On the map: named by a row, or (a top folder of MAPPED_ROOTS) holding folders that are."""
    if any(REPO / folder in set(_folders(cell)) for cell in rows):
        return True
    return folder.rstrip("/") in MAPPED_ROOTS and any(
        p.parent == REPO / folder for cell in rows for p in _folders(cell))


def test_every_folder_on_the_map_exists():
    rows = _rows((REPO / "CONTRIBUTING.md").read_text())
    assert len(rows) >= 15, f"the map has {len(rows)} folders: is the table still under {MAP_TITLE!r}?"
    gone = [cell for cell in rows if not _folders(cell)]
    assert gone == [], f"CONTRIBUTING.md's map names folders that are gone: {gone}"


def test_every_file_the_map_names_exists_in_its_row_folder():
    rows = _rows((REPO / "CONTRIBUTING.md").read_text())
    missing = []
    for cell, what in rows.items():
        for name in re.findall(r"`([\w./*-]+\.(?:py|md|yml|json))`", what):
            if not any(list(folder.glob(name)) or list(folder.glob(f"*/{name}")) for folder in _folders(cell)):
                missing.append(f"{cell} {name}")
        for sub in re.findall(r"`([\w-]+/)`", what):
            if not any((folder / sub).is_dir() or (REPO / "ranksight" / sub).is_dir() for folder in _folders(cell)):
                missing.append(f"{cell} {sub}")
    assert missing == [], f"CONTRIBUTING.md's map names files that are gone: {missing}"


def test_every_folder_of_the_tree_is_on_the_map():
    rows = _rows((REPO / "CONTRIBUTING.md").read_text())
    unmapped = [d for d in _tracked_folders() if not _covered(d, rows)]
    assert unmapped == [], f"folders missing from CONTRIBUTING.md's map: {unmapped}"


def test_the_map_check_fails_on_a_gone_folder():
    """The check itself can fail: a row naming a folder that does not exist is reported."""
    rows = _rows(f"{MAP_TITLE}\n\n| folder | what |\n|---|---|\n| `no_such_folder/` | nothing |\n")
    assert rows == {"no_such_folder/": "nothing"}
    assert [cell for cell in rows if not _folders(cell)] == ["no_such_folder/"]
