"""Orbax checkpoints of a training run: the whole train state, saved and resumed.

The train state holds the step, the parameters, the optimizer state and the
base RNG key; the loader's position is the step itself (see
``vit_jax.data.loader``), so restoring the state resumes the run exactly. Orbax
writes each checkpoint into a temporary directory and renames it when complete
(on every process together), so a crash while saving never damages the latest
complete checkpoint: ``latest_step`` only sees finished ones.
"""

from __future__ import annotations

from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath


def make_manager(workdir: str, *, every_steps: int, keep: int,
                 asynchronous: bool = True) -> ocp.CheckpointManager:
  """A manager for ``workdir/checkpoints`` that saves every N steps and keeps the last K."""
  return ocp.CheckpointManager(
      epath.Path(workdir) / 'checkpoints',
      options=ocp.CheckpointManagerOptions(
          save_interval_steps=every_steps, max_to_keep=keep, create=True,
          enable_async_checkpointing=asynchronous))


def save(manager: ocp.CheckpointManager, step: int, state: Any, *, force: bool = False) -> bool:
  """Saves (asynchronously) if ``step`` is due or ``force``; True if a save started."""
  return manager.save(step, args=ocp.args.StandardSave(state), force=force)


def restore(manager: ocp.CheckpointManager, abstract_state: Any, step: int | None = None) -> Any:
  """Restores onto the shardings of ``abstract_state`` (ShapeDtypeStructs with shardings).

  The shardings may differ from the ones it was saved with (another mesh or
  number of devices): Orbax reshards while reading.
  """
  step = manager.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f'No complete checkpoint in {manager.directory}.')
  return manager.restore(step, args=ocp.args.StandardRestore(abstract_state))


def abstract_like(tree: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs of ``tree`` carrying ``shardings``: the target of a restore."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)
