"""The job name (hooks/identity.py): RANKSIGHT_JOB, else the script or module name joined to the
Slurm job id or a rendezvous id the user chose; never torchrun's made-up uuid4. Every rank of one
job derives the same bounded label value from the environment and command line they share."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from ranksight import protocol
from ranksight.hooks.identity import (PART_MAX, Identity, chosen_run_id, job_line, job_name, job_source,
                                      script_name)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("env, argv0, module, want, source", [
    ({}, "/home/u/train.py", None, "train", "the script name"),
    ({"RANKSIGHT_JOB": "llama-7b"}, "/home/u/train.py", None, "llama-7b", "RANKSIGHT_JOB"),
    ({"RANKSIGHT_JOB": "a", "SLURM_JOB_ID": "9", "TORCHELASTIC_RUN_ID": "r"}, "t.py", None, "a", "RANKSIGHT_JOB"),
    # torchrun --standalone (and a one-node c10d rendezvous without --rdzv-id): a uuid4 per run
    ({"TORCHELASTIC_RUN_ID": str(uuid.uuid4())}, "train.py", None, "train", "the script name"),
    ({"TORCHELASTIC_RUN_ID": str(uuid.uuid4()).upper()}, "train.py", None, "train", "the script name"),
    ({"TORCHELASTIC_RUN_ID": "none"}, "train.py", None, "train", "the script name"),  # torchrun's default
    ({"TORCHELASTIC_RUN_ID": "myrun"}, "train.py", None, "train-myrun", "the script name and torchrun's --rdzv-id"),
    ({"SLURM_JOB_ID": "81234"}, "train.py", None, "train-81234", "the script name and the Slurm job id"),
    ({"SLURM_JOBID": "81234"}, "train.py", None, "train-81234", "the script name and the Slurm job id"),
    # srun + torchrun: Slurm's id, whatever the rendezvous id
    ({"SLURM_JOB_ID": "81234", "TORCHELASTIC_RUN_ID": "81234"}, "train.py", None, "train-81234",
     "the script name and the Slurm job id"),
    ({"SLURM_JOB_ID": "81234", "TORCHELASTIC_RUN_ID": "myrun"}, "train.py", None, "train-81234",
     "the script name and the Slurm job id"),
    ({"SLURM_JOB_ID": "81234"}, "/x/pkg/train.py", "pkg.train", "pkg.train-81234",
     "the module name and the Slurm job id"),
    ({}, "/x/pkg/__main__.py", "pkg", "pkg", "the module name"),
    ({}, "/x/pkg/__main__.py", None, "pkg", "the script name"),
    ({}, "-c", None, "python", "the interpreter"),
    ({}, "", None, "python", "the interpreter"),
    ({"RANKSIGHT_JOB": "  "}, "train.py", None, "train", "the script name"),
])
def test_job_name_rule(env, argv0, module, want, source):
    assert job_source(env, argv0, module) == (want, source)
    assert job_name(env, argv0, module) == want


def test_only_a_uuid4_is_taken_for_torchruns_own_id():
    assert chosen_run_id({"TORCHELASTIC_RUN_ID": str(uuid.uuid4())}) == ""
    u1 = str(uuid.uuid1())  # not the kind torchrun makes up: the user's
    assert chosen_run_id({"TORCHELASTIC_RUN_ID": u1}) == u1
    assert chosen_run_id({"TORCHELASTIC_RUN_ID": " exp-3 "}) == "exp-3"
    assert chosen_run_id({}) == ""


def test_names_are_bounded_label_values():
    long_id = "x" * 500
    name = job_name({"TORCHELASTIC_RUN_ID": "a b/c\nd" + long_id}, "/p/my train (v2)!" + "y" * 300 + ".py")
    assert len(name) <= 2 * PART_MAX + 1 <= protocol.MAX_STR
    base, tag = name.split("-", 1)
    assert base.startswith("my_train_v2_y") and tag.startswith("a_b_c_dxxx"), name
    assert all(c.isalnum() or c in "_.-" for c in name)
    assert job_name({"TORCHELASTIC_RUN_ID": "--"}, "train.py") == "train"  # nothing left of the id
    assert job_name({}, "/p/训练.py") == "训练"  # letters of any script stay
    # the user's own name is taken as given, without control characters, within the protocol's bound
    assert job_name({"RANKSIGHT_JOB": "team a/run\t1\n" + "z" * 300}, "t.py") == ("team a/run1" + "z" * 300)[
        :protocol.MAX_STR]


def test_every_rank_derives_the_same_name():
    """Ranks differ only in their rank variables: the job name is the same on each."""
    shared = {"SLURM_JOB_ID": "77", "TORCHELASTIC_RUN_ID": str(uuid.uuid4()), "WORLD_SIZE": "4",
              "LOCAL_WORLD_SIZE": "2"}
    jobs = {Identity.detect(dict(shared, RANK=str(r), LOCAL_RANK=str(r % 2)), argv0="/a/train.py").job
            for r in range(4)}
    assert jobs == {"train-77"}


def test_job_line_says_where_the_name_came_from_and_how_to_choose():
    assert job_line("train", "the script name") == \
        "job name 'train' (from the script name; set RANKSIGHT_JOB to choose)"
    assert job_line("llama", "RANKSIGHT_JOB") == "job name 'llama' (from RANKSIGHT_JOB)"
    i = Identity.detect({"SLURM_JOB_ID": "5"}, argv0="train.py")
    assert i.job_line() == "job name 'train-5' (from the script name and the Slurm job id; set RANKSIGHT_JOB to choose)"
    assert script_name("/a/b/run.py") == ("run", "the script name")


@pytest.mark.slow
def test_a_real_process_names_its_script_or_its_module(tmp_path):
    """``python train.py`` and ``python -m pkg.train``: sys.argv[0] and the main module's spec."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    body = "from ranksight.hooks.identity import Identity\nprint(Identity.detect().job)\n"
    (pkg / "train.py").write_text(body)
    (tmp_path / "fit.py").write_text(body)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSIGHT", "SLURM", "TORCHELASTIC"))}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), REPO])
    got = [subprocess.run([sys.executable] + argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120) for argv in (["fit.py"], ["-m", "pkg.train"])]
    assert [r.stdout.strip() for r in got] == ["fit", "pkg.train"], [r.stderr[-2000:] for r in got]
