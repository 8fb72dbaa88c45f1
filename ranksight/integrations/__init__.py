"""Framework integrations: each module imports its framework only when it is imported itself.

* ``ranksight.integrations.transformers.RanksightCallback``: a Hugging Face ``TrainerCallback``;
* ``ranksight.integrations.lightning.RanksightCallback``: a Lightning ``Callback``;
* ``ranksight.integrations.accelerate.watch()``: ``ranksight.watch()`` plus Accelerate's
  ``save_state`` timed as a checkpoint write.

Every one drives the same Watcher step path as ``ranksight.watch()``: a step is one optimizer
step; several optimizers stepping in one iteration make one step. Importing this package
imports no framework and no torch: after ``import ranksight``, the first access to
``ranksight.integrations.<framework>`` imports that module (module ``__getattr__``), and a
missing framework is one ``ModuleNotFoundError`` line naming the extra to install.
"""
from __future__ import annotations

from importlib import import_module as _import_module

# module -> the extra of pyproject.toml that installs its framework
_FRAMEWORKS = {"transformers": "transformers", "lightning": "lightning", "accelerate": "accelerate"}


def __getattr__(name: str):
    extra = _FRAMEWORKS.get(name)
    if extra is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return _import_module(f"{__name__}.{name}")  # binds it as an attribute: asked once per name
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] == "ranksight":
            raise
        raise ModuleNotFoundError(f"{__name__}.{name}: {e}; install its framework with "
                                  f"pip install 'ranksight[{extra}]'", name=e.name) from None


def __dir__():
    return sorted(set(globals()) | set(_FRAMEWORKS))
