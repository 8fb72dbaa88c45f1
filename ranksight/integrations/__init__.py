"""Framework integrations: each module imports its framework only when it is imported itself.

* ``ranksight.integrations.transformers.RanksightCallback``: a Hugging Face ``TrainerCallback``;
* ``ranksight.integrations.lightning.RanksightCallback``: a Lightning ``Callback``;
* ``ranksight.integrations.accelerate.watch()``: ``ranksight.watch()`` plus Accelerate's
  ``save_state`` timed as a checkpoint write.

Every one drives the same Watcher step path as ``ranksight.watch()``: a step is one optimizer
step; several optimizers stepping in one iteration make one step. Importing this package
imports no framework and no torch.
"""
