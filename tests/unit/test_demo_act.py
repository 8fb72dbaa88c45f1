"""`ranksight demo --act`: the combinations it refuses (one error line, exit 2, before anything
starts), what it implies (--fault hang), the job it runs (examples/train_ddp.py with --resume under
torchrun) and its --help. The whole loop runs in tests/integration/test_demo.py."""
from __future__ import annotations

import argparse
import re

import pytest

from ranksight.cli import build_parser, main
from ranksight.tools import demo_act


@pytest.mark.parametrize("argv, line", [
    (["--fault", "straggler"], "--act ends a hang: it takes --fault hang (its default), not --fault straggler"),
    (["--fault", "none"], "--act ends a hang: it takes --fault hang (its default), not --fault none"),
    (["--strategy", "deepspeed"], "--act: the job resumes from the checkpoint files of --strategy ddp or fsdp; "
                                  "DeepSpeed writes its own: use --strategy ddp or fsdp"),
    (["--fault-after", "20", "--duration", "20"],
     "--act: --duration (the seconds the job trains in all) must exceed --fault-after (20)"),
    (["--fault-after", "-1"], "--fault-after must be 0 or more"),
])
def test_a_combination_act_cannot_run_is_one_line(argv, line, capsys, tmp_path):
    rc = main(["demo", "--act", "--run-dir", str(tmp_path / "demo"), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and err == f"ranksight: error: {line}\n", err
    assert not (tmp_path / "demo").exists()  # refused before anything started


def _args(*argv: str) -> argparse.Namespace:
    return build_parser(["demo", *argv]).parse_args(["demo", *argv])


def test_act_alone_implies_the_hang_and_a_resumable_job(tmp_path):
    args = _args("--act")
    assert args.fault is None and demo_act.check(args) is None and args.fault == "hang"
    job = demo_act.job_args(args, tmp_path)
    flags = dict(zip(job[::2], job[1::2]))
    assert "--resume" in job and flags["--fault"] == "hang" and flags["--rank-to-fault"] == "1"
    assert flags["--checkpoint-every"] == str(demo_act.CHECKPOINT_EVERY)
    assert flags["--checkpoint-dir"] == str(tmp_path / "checkpoints")
    # the job trains the healthy phase and then TRAIN_AFTER_RESUME seconds, counted across the restart
    assert float(flags["--fault-after"]) == demo_act.FAULT_AFTER
    assert float(flags["--duration"]) == demo_act.FAULT_AFTER + demo_act.TRAIN_AFTER_RESUME
    explicit = _args("--act", "--fault", "hang", "--fault-after", "10", "--duration", "40", "--rank-to-fault", "0")
    assert demo_act.check(explicit) is None
    flags = dict(zip(*[iter(demo_act.job_args(explicit, tmp_path))] * 2))
    assert flags["--duration"] == "40" and flags["--fault-after"] == "10" and flags["--rank-to-fault"] == "0"


def test_without_act_the_defaults_stay():
    args = _args()
    # run() resolves straggler, 30 s and 120 s
    assert args.fault is None and args.fault_after is None and args.duration is None and not args.act


def test_help_documents_act(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    out = capsys.readouterr().out
    assert re.search(r"^  --act\s", out, re.M), out
    assert "torchrun --max-restarts 3" in out and "hang" in out and "resume" in out
    assert f"not within {demo_act.RECOVER_LIMIT:g} s of the fault" in " ".join(out.split())
