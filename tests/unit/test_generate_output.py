"""Where `ranksight rules`, `ranksight dashboards` and `ranksight k8s` write: --out, by default
./run/<name> under the current directory, and the checkout's committed files only with
--in-place (the built-in defaults' render, nothing else); bad output folders are one line, exit 2.
Also the stop command `ranksight stack up` prints.

The committed folders are never written here: --in-place runs against a stand-in checkout
(``COMMITTED_DIR`` and the checkout root pointed at tmp_path). Budget: about a second, in-process.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Tuple

import pytest

from ranksight import cli, config
from ranksight.tools import k8s
from ranksight.alerts import generate as rules
from ranksight.dashboards import generate as dashboards
from ranksight.tools import stack

# subcommand -> (module, a file it writes, the committed folder relative to the checkout)
GENERATORS = {
    "rules": (rules, "ranksight-rules.yml", "alerts"),
    "dashboards": (dashboards, "ranksight-triage.json", "dashboards"),
    "k8s": (k8s, "agent/daemonset.yaml", "deploy/kubernetes"),
}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name == "RANKSIGHT_CONFIG" or name.startswith("RANKSIGHT__"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def _main(capsys, *argv: str) -> Tuple[int, str, List[str]]:
    try:
        rc = cli.main(list(argv))
    except SystemExit as e:  # argparse usage errors
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err.strip().splitlines()


def _one_error_line(rc: int, err: List[str]) -> str:
    assert rc == 2 and len(err) == 1 and err[0].startswith(cli.ERROR_PREFIX), (rc, err)
    return err[0]


@pytest.fixture
def checkout(monkeypatch, tmp_path) -> Path:
    """A stand-in checkout: each generator's COMMITTED_DIR under tmp_path/checkout."""
    root = tmp_path / "checkout"
    for name, (mod, _, rel) in GENERATORS.items():
        monkeypatch.setattr(mod, "COMMITTED_DIR", root / rel)
    monkeypatch.setattr(cli, "_checkout_root", lambda committed: root if root in committed.parents else None)
    return root


@pytest.mark.parametrize("name", GENERATORS)
def test_default_out_is_run_dir_under_the_cwd(name, capsys, tmp_path, checkout):
    _, written, _ = GENERATORS[name]
    rc, out, err = _main(capsys, name)
    assert rc == 0, err
    assert (tmp_path / "run" / name / written).is_file()
    assert f"run/{name}" in out
    assert not checkout.exists()


@pytest.mark.parametrize("name", GENERATORS)
def test_in_place_writes_the_committed_folder_from_the_defaults_only(name, capsys, checkout):
    mod, written, rel = GENERATORS[name]
    rc, _, err = _main(capsys, name, "--in-place")
    assert rc == 0, err
    assert (checkout / rel / written).is_file()
    assert not (Path("run") / name).exists()
    if name != "rules":  # --check compares the same folder --in-place writes
        assert _main(capsys, name, "--in-place", "--check")[0] == 0


@pytest.mark.parametrize("name, argv, env, named", [
    ("rules", ["--profile", "test"], {}, "--profile test"),
    ("k8s", ["--profile", "test"], {}, "--profile test"),
    ("k8s", ["--namespace", "other"], {}, "--namespace other"),
    ("k8s", ["--image", "registry.example/ra:1"], {}, "--image registry.example/ra:1"),
    ("dashboards", ["--config", "c.yml"], {}, "thresholds.comm_share=0.4 from --config c.yml"),
    ("rules", [], {"RANKSIGHT_CONFIG": "c.yml"}, "thresholds.comm_share=0.4 from $RANKSIGHT_CONFIG c.yml"),
    ("k8s", [], {"RANKSIGHT__thresholds__comm_share": "0.4"},
     "thresholds.comm_share=0.4 from RANKSIGHT__thresholds__comm_share"),
])
def test_in_place_refuses_any_other_render(name, argv, env, named, capsys, monkeypatch, checkout):
    Path("c.yml").write_text("thresholds: {comm_share: 0.4}\n")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    committed = checkout / GENERATORS[name][2]
    line = _one_error_line(*_main(capsys, name, "--in-place", *argv)[::2])
    assert f"not of {named};" in line and "--out DIR" in line, line
    # an --out naming the committed folder is --in-place under another name
    line = _one_error_line(*_main(capsys, name, "--out", str(committed), *argv)[::2])
    assert line.startswith(f"{cli.ERROR_PREFIX}--out {committed}: the committed {GENERATORS[name][2]}/"), line
    assert not checkout.exists()
    # the same render goes anywhere else
    rc, _, err = _main(capsys, name, "--out", "elsewhere", *argv)
    assert rc == 0 and (Path("elsewhere") / GENERATORS[name][1]).is_file(), err


def test_a_config_equal_to_the_defaults_may_write_in_place(capsys, checkout):
    Path("c.yml").write_text(f"thresholds: {{comm_share: {config.load(env={}).thresholds['comm_share']}}}\n")
    rc, _, err = _main(capsys, "rules", "--in-place", "--config", "c.yml")
    assert rc == 0 and (checkout / "alerts" / rules.RULES_FILE).is_file(), err


@pytest.mark.parametrize("name", GENERATORS)
def test_bad_out_is_one_line(name, capsys):
    Path("a-file").write_text("")
    assert "a-file is not a directory" in _one_error_line(*_main(capsys, name, "--out", "a-file")[::2])
    line = _one_error_line(*_main(capsys, name, "--out", "a-file/below")[::2])
    assert "cannot create a-file/below" in line
    line = _one_error_line(*_main(capsys, name, "--out", "/proc/ranksight-nowhere")[::2])
    assert "cannot create /proc/ranksight-nowhere" in line
    line = _one_error_line(*_main(capsys, name, "--out", "x", "--in-place")[::2])
    assert "not allowed with argument --out" in line


def test_in_place_needs_a_checkout():
    assert cli._checkout_root(rules.COMMITTED_DIR) == rules.COMMITTED_DIR.parent
    assert cli.committed_label(k8s.COMMITTED_DIR) == "deploy/kubernetes/"
    installed = Path("/usr/lib/python3/dist-packages/ranksight/alerts")  # pip install ., not -e
    assert cli._checkout_root(installed) is None


def test_help_names_the_default_and_the_in_place_folder(capsys):
    for name, (_, _, rel) in GENERATORS.items():
        with pytest.raises(SystemExit):
            cli.main([name, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert f"(default: ./run/{name}, under the current directory)" in text, name
        assert f"--in-place write this checkout's committed {rel}/ instead" in text, name


def test_stack_stop_hint_is_the_shortest_command_from_here(tmp_path):
    assert stack.stack_command("down", "run/stack") == "ranksight stack down"
    assert stack.stack_command("down", tmp_path / "run" / "stack") == "ranksight stack down"
    assert stack.stack_command("down", "run/other") == "ranksight stack down --run-dir run/other"
    far = Path("/var/tmp/ranksight stack")
    assert stack.stack_command("down", far) == "ranksight stack down --run-dir '/var/tmp/ranksight stack'"
    os.chdir(tmp_path / "..")
    assert stack.stack_command("down", tmp_path / "run" / "stack") == (
        f"ranksight stack down --run-dir {tmp_path.name}/run/stack")
