"""The root folder of a ranksight checkout, found by ``import ranksight``: load the installed package.

A script beside a checkout folder named ``ranksight`` (``~/ranksight`` and ``~/train.py``) has the
script's folder first on ``sys.path``, so ``import ranksight`` finds this folder before the installed
package. Without this file Python would take the folder for an empty namespace package (with an
editable install, whose finder comes after the path search) and the script would stop at "module
'ranksight' has no attribute 'watch'". With it, the import loads the installed ranksight (``pip
install`` or ``pip install -e`` of any checkout, this one included) as if the folder were not there.
With none installed it fails with one line that names the folder and the fix.

Nothing installs this file: pyproject.toml lists the packages, and this folder is none of them. From
the checkout's own root, ``import ranksight`` finds ``ranksight/``. Under any other name the file does
nothing: pytest, whose rootdir this is, imports it as the package of the rootdir (the folder's name)
to look for a ``setup_module``.
"""
import importlib.machinery
import importlib.util
import os
import sys

_ROOT = os.path.dirname(os.path.abspath(__file__))


class CheckoutShadowError(ImportError):
    """A ranksight checkout folder stands where ``import ranksight`` looks, and none is installed."""


def _is_shadow(folder: str) -> bool:
    """A folder that ``import ranksight`` must look past: this one, or another ranksight checkout."""
    if os.path.realpath(folder) == os.path.realpath(_ROOT):
        return True
    return (os.path.isfile(os.path.join(folder, "pyproject.toml"))
            and os.path.isfile(os.path.join(folder, "ranksight", "__init__.py")))


def _installed_spec():
    """The spec ``import ranksight`` would find if no checkout folder stood on ``sys.path``."""
    path = [p for p in sys.path if isinstance(p, str) and not _is_shadow(os.path.join(p or os.curdir, "ranksight"))]
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        spec = find("ranksight", path if finder is importlib.machinery.PathFinder else None)
        if (spec is not None and spec.loader is not None and spec.origin
                and not _is_shadow(os.path.dirname(os.path.abspath(spec.origin)))):
            return spec
    return None


def _one_line_excepthook(previous):
    def hook(kind, value, tb):
        if issubclass(kind, CheckoutShadowError):
            print(value, file=sys.stderr)
        else:
            previous(kind, value, tb)
    return hook


if __name__ == "ranksight":
    _spec = _installed_spec()
    if _spec is None:
        sys.excepthook = _one_line_excepthook(sys.excepthook)  # uncaught: the line alone, no traceback
        raise CheckoutShadowError(
            f"ranksight: {_ROOT} is a ranksight checkout, not the package, and no ranksight is installed for "
            f"{sys.executable}: pip install -e {_ROOT}, or run the script with the checkout's venv "
            f"({os.path.join(_ROOT, '.venv', 'bin', 'python')}, made by {os.path.join(_ROOT, 'scripts', 'setup')})")
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["ranksight"] = _module  # the import statement returns what sys.modules holds once this file ran
    _spec.loader.exec_module(_module)
