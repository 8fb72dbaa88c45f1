"""Every `ranksight ...` command line of the README parses with the real CLI, the scripts it
names exist, and the extras it names are pyproject.toml's.

Command lines come from the ```sh blocks (each `ranksight` command of a line, split at `;`, `&`,
`&&` and `|`) and from inline code that gives arguments. Usage notation is expanded: `[x]` is
taken, `a|b` (no spaces: values; with spaces: whole options) is tried once per alternative,
`...` is dropped. Parsing only: nothing runs. A renamed flag, a dropped choice or a subcommand
the README shows with arguments it does not take fails here with the CLI's own error line.
"""
from __future__ import annotations

import os
import re
import shlex
import sys
import tomllib
from typing import Iterator, List

import pytest

from test_readme import README, REPO, section

# placeholders that stand for a choice: `ranksight bench NAME`, `ranksight demo --fault FAULT`
PLACEHOLDERS = {"NAME": "scale", "FAULT": "straggler"}


def sh_commands() -> Iterator[List[str]]:
    """argv of every `ranksight` command in the README's sh blocks."""
    for block in re.findall(r"^```sh\n(.*?)^```", README.read_text(), re.S | re.M):
        for line in block.splitlines():
            lex = shlex.shlex(line, posix=True, punctuation_chars=True)
            lex.whitespace_split = True
            argv: List[str] = []
            for tok in list(lex) + [";"]:
                if tok in (";", "&", "&&", "|", "||"):
                    if argv and argv[0] == "ranksight":
                        yield argv[1:]
                    argv = []
                else:
                    argv.append(tok)


def usage_variants(usage: str) -> List[List[str]]:
    """The argv lists a usage line stands for: every optional part taken, each alternative once."""
    groups: List[List[List[str]]] = []  # a group: its alternatives, each a token list
    for m in re.finditer(r"\[([^\]]*)\]|(\S+)", usage.replace("\\|", "|")):
        alts = [a.split() for a in m.group(1).split(" | ")] if m.group(1) is not None else [[m.group(2)]]
        expanded = []
        for alt in alts:
            toks = [PLACEHOLDERS.get(t, t).replace(",...", "") for t in alt if t != "..."]
            # a token a|b|c (no spaces) is one value with alternatives
            multi = [i for i, t in enumerate(toks) if "|" in t]
            if not multi:
                expanded.append(toks)
            for i in multi[:1]:
                expanded += [toks[:i] + [v] + toks[i + 1:] for v in toks[i].split("|")]
        groups.append(expanded)
    base = [g[0] for g in groups]
    out = [sum(base, [])]
    for gi, g in enumerate(groups):
        for alt in g[1:]:
            out.append(sum(base[:gi] + [alt] + base[gi + 1:], []))
    return [argv[1:] for argv in out]  # without "ranksight"


def inline_commands() -> Iterator[List[str]]:
    for m in re.finditer(r"`(ranksight \S[^`]*)`", README.read_text()):
        text = m.group(1)
        if len(text.split()) > 2:  # `ranksight stack` names a command; with arguments it is one
            yield from usage_variants(text)


def parse(argv: List[str], monkeypatch, capsys) -> None:
    from ranksight import cli

    monkeypatch.setattr(sys, "argv", ["ranksight", *argv])  # `bench` reads its subcommand from sys.argv
    try:
        cli.build_parser(argv).parse_args(argv)
        code = 0
    except SystemExit as e:
        code = e.code
    if code:
        pytest.fail(f"README: `ranksight {' '.join(argv)}`: {capsys.readouterr().err.strip()}", pytrace=False)


def test_the_readme_shows_commands_in_both_forms():
    assert len(list(sh_commands())) >= 6
    assert ["triage", "--prometheus", "http://127.0.0.1:9090", "--profile", "test", "--since", "10m"] in list(
        inline_commands())
    # usage notation: optional parts taken, each alternative once
    assert usage_variants("ranksight stack up\\|down [--run-dir run/stack] [--out DIR \\| --in-place]") == [
        ["stack", "up", "--run-dir", "run/stack", "--out", "DIR"],
        ["stack", "down", "--run-dir", "run/stack", "--out", "DIR"],
        ["stack", "up", "--run-dir", "run/stack", "--in-place"]]


@pytest.mark.parametrize("argv", [pytest.param(a, id=" ".join(a)[:60]) for a in sh_commands()])
def test_sh_block_command_parses(argv, monkeypatch, capsys):
    parse(argv, monkeypatch, capsys)


@pytest.mark.parametrize("argv", [pytest.param(a, id=" ".join(a)[:60]) for a in inline_commands()])
def test_inline_command_parses(argv, monkeypatch, capsys):
    parse(argv, monkeypatch, capsys)


def test_the_parser_check_can_fail(monkeypatch, capsys):
    with pytest.raises(pytest.fail.Exception, match=r"unrecognized arguments: --sinse"):
        parse(["triage", "--prometheus", "http://x", "--sinse", "15m"], monkeypatch, capsys)


def test_the_triage_default_is_now_not_15m():
    """`--since` has no default (each check judged now); the README's usage must not show one."""
    from ranksight.tools import triage_cli

    import argparse

    p = argparse.ArgumentParser()
    triage_cli.add_arguments(p)
    assert p.get_default("since") is None
    row = next(ln for ln in README.read_text().splitlines() if ln.startswith("| `ranksight triage "))
    assert "[--since DURATION]" in row and "now" in row, row


def test_scripts_the_readme_names_exist():
    names = set(re.findall(r"\./scripts/(\w+)", README.read_text())) | set(
        re.findall(r"`scripts/(\w+)", README.read_text()))
    assert {"demo", "test", "setup"} <= names, names
    for name in names:
        path = REPO / "scripts" / name
        assert path.is_file() and os.access(path, os.X_OK), path


def test_extras_the_readme_names_are_pyprojects():
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    text = README.read_text()
    named = set(re.findall(r"ranksight\[(\w+)\]", text))
    assert named and named <= extras, named - extras
    table = section("Install into your own environment")
    assert {e for e in extras if f"| `{e}` |" in table} == extras, "an extra missing from the README's table"


def test_paths_the_readme_names_exist():
    """Every checkout path the README names (`examples/train_hf.py`, `deploy/slurm/README.md`, ...)."""
    tops = sorted(p.name for p in REPO.iterdir() if not p.name.startswith(".") and p.name not in ("run", "build"))
    text = README.read_text()
    pattern = r"(?<![\w/.-])((?:%s)/[\w./<>*-]*)" % "|".join(map(re.escape, tops))
    paths = {m.rstrip(".,)") for m in re.findall(pattern, text)}
    named = {p for p in paths if not re.search(r"[<>*]|/[A-Z]+(/|$)", p)}  # not a pattern or a placeholder
    assert len(named) > 30, named
    assert sorted(p for p in named if not (REPO / p).exists()) == []
