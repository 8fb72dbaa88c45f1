"""What a new user meets first, in fresh processes: ``import ranksight`` stays light and reaches
every integration by attribute, and a checkout folder named ``ranksight`` beside the user's
script (``~/ranksight`` and ``~/train.py``) loads the installed package, or says in one line that
none is installed."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def py(code: str, cwd: Path, *flags: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    return subprocess.run([sys.executable, *flags, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)


def test_import_ranksight_imports_no_torch_and_no_framework(tmp_path):
    p = py("import sys, ranksight\n"
           "i = ranksight.integrations\n"
           "assert {'transformers', 'lightning', 'accelerate'} <= set(dir(i)), dir(i)\n"
           "assert {'watch', 'integrations', 'hooks'} <= set(dir(ranksight))\n"
           "heavy = {'torch', 'transformers', 'lightning', 'pytorch_lightning', 'accelerate'} & set(sys.modules)\n"
           "assert not heavy, heavy\n"
           "print(i.__name__)", tmp_path)
    assert p.returncode == 0 and p.stdout.split() == ["ranksight.integrations"], p.stderr


def test_unknown_names_stay_attribute_errors(tmp_path):
    p = py("import ranksight\n"
           "for mod, name in ((ranksight, 'integration'), (ranksight.integrations, 'keras')):\n"
           "    assert not hasattr(mod, name), name\n"
           "print('ok')", tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def test_a_missing_framework_names_its_extra(tmp_path):
    p = py("import sys, ranksight\n"
           "sys.modules['lightning'] = sys.modules['pytorch_lightning'] = None  # not installed\n"
           "ranksight.integrations.lightning", tmp_path)
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 1 and last.startswith("ModuleNotFoundError: ranksight.integrations.lightning: "), p.stderr
    assert last.endswith("pip install 'ranksight[lightning]'"), last


# ---------------------------------------------------------------- a checkout beside the script
TRAIN = ("import ranksight\n"
         "print(ranksight.__file__)\n"
         "print(ranksight.integrations.__name__, ranksight.__version__)\n")


def shadow_layout(tmp_path: Path, how: str) -> Path:
    """tmp/ranksight (the whole checkout as a symlink, or a folder with a copy of its root
    __init__.py alone) and tmp/train.py beside it, as ~/ranksight and ~/train.py."""
    if how == "clone":
        (tmp_path / "ranksight").symlink_to(REPO, target_is_directory=True)
    else:
        (tmp_path / "ranksight").mkdir()
        shutil.copy(REPO / "__init__.py", tmp_path / "ranksight" / "__init__.py")
    (tmp_path / "train.py").write_text(TRAIN)
    return tmp_path / "train.py"


def run_script(script: Path, cwd: Path, *flags: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    return subprocess.run([sys.executable, *flags, str(script)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)


def test_a_clone_beside_the_script_loads_the_installed_package(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    installed = py("import ranksight; print(ranksight.__file__, ranksight.__version__)", tmp_path / "elsewhere")
    file, version = installed.stdout.split()
    for how in ("clone", "root file alone"):
        d = tmp_path / how.replace(" ", "-")
        d.mkdir()
        script = shadow_layout(d, how)
        for cwd in (d, tmp_path):  # the script's folder is on sys.path first, from anywhere
            p = run_script(script, cwd)
            assert p.returncode == 0, (how, p.stderr)
            assert p.stdout.splitlines() == [file, f"ranksight.integrations {version}"], (how, p.stdout, p.stderr)


def test_a_clone_beside_the_script_with_nothing_installed_is_one_line(tmp_path):
    script = shadow_layout(tmp_path, "clone")
    p = run_script(script, tmp_path, "-S")  # -S: no site-packages, so no ranksight installed
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1, (p.returncode, p.stderr)
    assert lines[0].startswith(f"ranksight: {tmp_path / 'ranksight'} is a ranksight checkout, not the package, "
                               "and no ranksight is installed for "), lines[0]
    assert f"pip install -e {tmp_path / 'ranksight'}" in lines[0], lines[0]
    assert "Traceback" not in p.stderr and p.stdout == ""


def test_a_script_that_catches_the_import_error_goes_on(tmp_path):
    """The error is an ImportError: `try: import ranksight / except ImportError:` still works."""
    script = shadow_layout(tmp_path, "clone")
    script.write_text("try:\n    import ranksight\nexcept ImportError as e:\n    print('without ranksight:', e)\n")
    p = run_script(script, tmp_path, "-S")
    assert p.returncode == 0 and p.stdout.startswith("without ranksight: ranksight: "), (p.stdout, p.stderr)


def test_the_root_file_under_another_name_does_nothing(tmp_path):
    """pytest imports the rootdir's __init__.py as the package of the folder's name."""
    p = py("import importlib.util, sys\n"
           f"spec = importlib.util.spec_from_file_location('main', {str(REPO / '__init__.py')!r})\n"
           "m = importlib.util.module_from_spec(spec)\n"
           "spec.loader.exec_module(m)\n"
           "print('ranksight' in sys.modules)", tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stderr
