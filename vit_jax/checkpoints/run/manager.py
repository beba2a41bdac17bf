"""Orbax checkpoints of a training run: the whole train state, saved, verified and resumed.

The train state holds the step, the parameters, the optimizer state and the base RNG key; the
loader's position is the step, so restoring the state resumes the run exactly. Orbax renames a
checkpoint into place when complete, so a crash while saving never damages the latest one.
Damage after that is found at restore: each save records every array's dtype, shape and
checksum (``describe``, ``checksum``), and ``resume`` moves a damaged step to
``checkpoints/bad/STEP`` and restores the one before (all processes agree). Only the files tell
damage (``damaged``: one missing or unreadable, TensorStore finding one cut short or failing its
checksum, the checksums differing): a checkpoint of another model stops the run
(``CheckpointMismatchError``), and any other refusal of Orbax's is a plain error, the
checkpoint left where it is. Orbax is given absolute paths (it refuses relative ones).
The record also says whether each array is finite: ``save`` refuses a non-finite state (a
diverged run's) unless asked, the newest good checkpoint is never rotated out, and ``resume``
moves a non-finite one to ``checkpoints/nonfinite/STEP`` and restores the one before.
"""

from __future__ import annotations

import json
import os
import re
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from vit_jax.base import console, errors, paths, sharding
from vit_jax.checkpoints.run import checksum, record

ARRAYS = 'vit_jax_arrays'  # Key of ``describe``'s record in the step's custom metadata.
STEP_METADATA = '_CHECKPOINT_METADATA'  # Orbax's per-step metadata file.
BAD = 'bad'  # checkpoints/bad/STEP: the damaged checkpoints, moved aside.
NONFINITE = 'nonfinite'  # checkpoints/nonfinite/STEP: a diverged state's, moved aside.
# What a restore may raise that is not damage, raised as it is: another model's state (the
# config changed) and a host out of memory. Other errors are damage only where ``damaged``
# says so; the rest are Orbax's refusals, each a plain CheckpointError.
NOT_DAMAGE = (errors.CheckpointMismatchError, MemoryError)
# The statuses of TensorStore's errors (ValueErrors; Orbax 0.12.8 wraps those of an array's
# chunks in a plain Exception) about the files: one cut short or emptied (OUT_OF_RANGE),
# failing its checksum (DATA_LOSS), missing (NOT_FOUND; FAILED_PRECONDITION: a data file the
# OCDBT tree names).
_FILE_STATUS = re.compile(r'^(OUT_OF_RANGE|DATA_LOSS|NOT_FOUND|FAILED_PRECONDITION): ')
# The files of a step every restore needs (besides STEP_METADATA, which ``recorded`` reads):
# Orbax's errors where they are missing say nothing of files (a KeyError, a pytree mismatch).
_NEEDED = ('default', os.path.join('default', '_METADATA'))


class Manager(ocp.CheckpointManager):
  """Orbax's manager, with a save that fails raised as one ``errors.CheckpointSaveError``.

  Orbax writes in a background thread and raised its failure (disk full, permission)
  only at the next save or at the end, as a long traceback; here ``check_saves`` (called
  every step) raises it as soon as the write has ended, naming the step and the cause.
  Orbax's temporary folder of the failed save is never a checkpoint (removed at the next
  start), so the ones before stay intact.
  """

  _pending: int | None = None  # The step whose save is being written.
  _failed: errors.CheckpointSaveError | None = None  # Raised once; the clean-up stays quiet.

  def __init__(self, *args: Any, **kwargs: Any):
    self.good: dict[int, bool | None] = {}  # Step -> finite (None: not recorded), as read.
    super().__init__(*args, **kwargs)

  def is_good(self, step: int) -> bool | None:
    """Whether checkpoint ``step`` was recorded finite (None: an older one, not recorded)."""
    if step not in self.good:
      try:
        self.good[step] = good(recorded(epath.Path(self.directory) / str(step)))
      except errors.CheckpointError:  # Unreadable: damage, which resume finds.
        return None
    return self.good[step]

  def save(self, step: int, *args: Any, **kwargs: Any) -> bool:
    if self._pending is not None:  # The save before: its failure is its own.
      self.wait_until_finished()
    try:
      started = super().save(step, *args, **kwargs)
    except Exception as e:
      raise self._failure(step, e) from None
    if started:
      self._pending = step
    return started

  def check_saves(self) -> None:
    """Raises ``errors.CheckpointSaveError`` if the save in the background has failed."""
    if self._pending is not None and not self.is_saving_in_progress():
      self.wait_until_finished()

  def wait_until_finished(self) -> None:
    try:
      super().wait_until_finished()
    except Exception as e:
      if self._failed is not None:  # Already raised: the clean-up after it.
        return
      raise self._failure(self._pending, e) from None
    self._pending = None

  def close(self) -> None:
    try:
      super().close()
    except Exception as e:
      if self._failed is None:
        raise self._failure(self._pending, e) from None
    if self._failed is not None:
      release_abandoned_threads()

  def _failure(self, step: int | None, e: BaseException) -> errors.CheckpointSaveError:
    console.silence_abandoned_reads()  # The writes abandoned after the first failure.
    # Orbax's coroutines of the abandoned save, collected at exit, each warned (two lines).
    warnings.filterwarnings('ignore', message=r"coroutine '.*' was never awaited",
                            category=RuntimeWarning)
    release_abandoned_threads()
    cause, fix = errors.write_failure(causes(e)[-1])
    kept = [s for s in self.all_steps() if s != step]
    before = (f'The checkpoints before it are intact (steps {", ".join(map(str, kept))}): '
              if kept else 'No checkpoint was written before it: ')
    self._failed = errors.CheckpointSaveError(
        f'Saving the checkpoint at step {step} in {self.directory} failed: {cause}. {before}'
        f'{fix}, then run the same command again to resume'
        f'{f" from step {kept[-1]}" if kept else ""}.')
    self._pending = None
    return self._failed


def release_abandoned_threads() -> None:
  """Ends Orbax's threads of a failed save that still wait for the signals of its steps that
  never ran (e.g. creating the step's folder on a read-only file system): they are not
  daemons, so the process would hang at exit, at 0% CPU, for Orbax's barrier timeout. Each
  is cancelled, then woken by its own signals. One process only: the signals of a
  multi-process run are the job's."""
  if jax.process_count() > 1:
    return
  try:
    from orbax.checkpoint._src.futures import future
  except ImportError:  # Another Orbax: nothing known to release.
    return
  signaling = getattr(future, '_SignalingThread', None)
  for thread in threading.enumerate():
    if signaling is not None and isinstance(thread, signaling) and thread.is_alive():
      thread.cancel()
      future.set_signals(thread._receive_signals, operation_id=thread._operation_id)


def check_saves(manager: ocp.CheckpointManager) -> None:
  """Raises ``errors.CheckpointSaveError`` at once if a background save has failed.

  Call it every step. With several processes it does nothing (each would decide alone,
  and one stopping leaves the others at a barrier): the next save reports it there.
  """
  if isinstance(manager, Manager) and jax.process_count() == 1:
    manager.check_saves()


class _KeepNewestGood:
  """Orbax's preservation policy: the last ``keep``, and the newest good (finite) checkpoint
  whatever came after it, so that a diverged state never rotates the last good one out."""

  def __init__(self, keep: int):
    self.latest = ocp.checkpoint_managers.LatestN(n=keep)
    self.manager: Manager | None = None

  def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> list[bool]:
    keep = list(self.latest.should_preserve(checkpoints, context=context))
    # Unrecorded (older) checkpoints count as good: nothing says they are not.
    good = [i for i, c in enumerate(checkpoints) if self.manager.is_good(c.step) is not False]
    if good:
      keep[max(good, key=lambda i: checkpoints[i].step)] = True
    return keep


def make_manager(workdir: str, *, every_steps: int, keep: int,
                 asynchronous: bool = True) -> ocp.CheckpointManager:
  """A manager for ``workdir/checkpoints`` that saves every N steps and keeps the last K (and
  the newest good one)."""
  # Before the first save: a failed write's abandoned callbacks fire in Orbax's background
  # thread, before its failure reaches ``check_saves``.
  console.silence_abandoned_reads()
  policy = _KeepNewestGood(keep)
  manager = Manager(
      paths.absolute(workdir) / record.CHECKPOINTS,
      options=ocp.CheckpointManagerOptions(
          save_interval_steps=every_steps, preservation_policy=policy, create=True,
          enable_async_checkpointing=asynchronous,
          cleanup_tmp_directories=True),  # What a killed save left: never a checkpoint.
      # One unnamed item: said here, not guessed from the newest step's folders (a
      # damaged step would make Orbax expect several items in every other step too).
      item_handlers=ocp.StandardCheckpointHandler())
  policy.manager = manager
  return manager


class NonFiniteState(Exception):  # noqa: N818 (the loop's signal, not an error to print)
  """``save`` of a state that holds NaN or infinity: nothing was written."""

  def __init__(self, step: int, paths: list[str]):
    super().__init__(f'the state at step {step} is not finite ({some_paths(paths)})')
    self.step, self.paths = step, paths


def save(manager: ocp.CheckpointManager, step: int, state: Any, *, force: bool = False,
         allow_nonfinite: bool = False) -> bool:
  """Saves (asynchronously) if ``step`` is due or ``force``, recording its arrays' checksums
  and whether each is finite; a state that is not raises ``NonFiniteState`` (nothing is
  written) unless ``allow_nonfinite``.

  True if a save started. Call it on every process (the checksums are collective).
  """
  if not (force or manager.should_save(step)):
    return False
  arrays = describe(state)
  if (bad := nonfinite(arrays)) and not allow_nonfinite:
    raise NonFiniteState(step, bad)
  if isinstance(manager, Manager):
    manager.good[step] = not bad
  return manager.save(step, args=ocp.args.StandardSave(state), force=force,
                      custom_metadata={ARRAYS: arrays})


def describe(tree: Any) -> dict[str, dict[str, Any]]:
  """{path: {'dtype', 'shape', 'checksum', 'finite'}} of every array: what a checkpoint
  records."""
  sums = checksum.summary(tree)
  return {path: {'dtype': np.dtype(x.dtype).name, 'shape': list(x.shape),
                 'checksum': sums[path][0], 'finite': sums[path][1]}
          for path, x in _leaves(tree).items()}


def nonfinite(arrays: dict[str, dict[str, Any]] | None) -> list[str]:
  """The paths that the record ``arrays`` says hold NaN or infinity."""
  return [path for path, a in (arrays or {}).items() if a.get('finite') is False]


def good(arrays: dict[str, dict[str, Any]] | None) -> bool | None:
  """Whether the record ``arrays`` says every array is finite; None where it does not say
  (a checkpoint of an older vit_jax)."""
  if not arrays or any('finite' not in a for a in arrays.values()):
    return None
  return not nonfinite(arrays)


def some_paths(paths: list[str]) -> str:
  """The first three of ``paths``, and how many more."""
  return ', '.join(paths[:3]) + (f' and {len(paths) - 3} more' if len(paths) > 3 else '')


def recorded(step_dir: epath.Path) -> dict[str, dict[str, Any]] | None:
  """What ``describe`` recorded when the checkpoint was written; None for older ones.

  Checkpoints of older versions have no record (they restore unverified, with a
  warning). Raises ``errors.CheckpointError`` when the step's metadata is unreadable.
  """
  path = step_dir / STEP_METADATA
  try:
    metadata = json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise errors.CheckpointError(
        f'its {STEP_METADATA} cannot be read ({errors.short(e)})') from None
  return (metadata.get('custom_metadata') or {}).get(ARRAYS)


_UNVERIFIED: set[str] = set()  # The checkpoints said to be restored unverified, in this process.


def verify(tree: Any, arrays: dict[str, dict[str, Any]] | None,
           step_dir: epath.Path) -> tuple[str, list[str]]:
  """(The problem of the restored ``tree`` against the record ``arrays``, '' if none; the
  paths of ``tree`` that hold NaN or infinity), in one pass."""
  sums = checksum.summary(tree)
  nonfinite_paths = [path for path, (_, finite) in sums.items() if not finite]
  if arrays is None:
    if str(step_dir) not in _UNVERIFIED:  # Once: a command may read it twice (export --evaluate).
      _UNVERIFIED.add(str(step_dir))
      logging.warning('%s has no checksums (written by an older vit_jax): restored unverified.',
                      step_dir)
    return '', nonfinite_paths
  bad = [path for path, (value, _) in sums.items()
         if arrays.get(path, {}).get('checksum') != value]
  if not bad:
    return '', nonfinite_paths
  more = ', ...' if len(bad) > 3 else ''
  return (f'{len(bad)} of its arrays differ from the checksums recorded when it was written '
          f'({", ".join(bad[:3])}{more})'), nonfinite_paths


def restore(manager: ocp.CheckpointManager, abstract_state: Any, step: int | None = None) -> Any:
  """Restores and verifies onto the shardings of ``abstract_state`` (ShapeDtypeStructs).

  The shardings may differ from the ones it was saved with (another mesh or
  number of devices): Orbax reshards while reading. A damaged checkpoint, or one
  that does not fit ``abstract_state``, raises ``errors.CheckpointError``.
  """
  step = manager.latest_step() if step is None else step
  if step is None:
    raise errors.MissingFileError(f'No complete checkpoint in {manager.directory}.')
  state, problem, _ = _restore_verified(manager, abstract_state, step)
  if problem:
    raise errors.CheckpointError(f'The checkpoint at step {step} in {manager.directory} is '
                                 f'damaged: {problem}.')
  return state


def resume(manager: ocp.CheckpointManager, abstract_state: Any) -> Any | None:
  """The newest checkpoint that restores, verifies and is finite; None where there is none.

  Each damaged one on the way is logged with its problem and moved to
  ``checkpoints/bad/STEP``; each non-finite one (a diverged run's, recorded so or, for
  an older checkpoint, found so) to ``checkpoints/nonfinite/STEP``. When none is left,
  ``errors.CheckpointError`` lists every step and its problem. Call it on every process:
  they agree on the step.
  """
  problems, skipped = [], False
  for step in sorted(manager.all_steps(), reverse=True):
    step_dir = epath.Path(manager.directory) / str(step)
    recorded_bad = _recorded_nonfinite(step_dir)
    state, problem, bad = (None, '', recorded_bad) if recorded_bad else \
        _restore_verified(manager, abstract_state, step)
    if not problem and bad:
      moved = _move_aside(manager, step, NONFINITE)
      logging.warning('The checkpoint at step %d in %s is not finite (%s: its run diverged): '
                      'moved to %s.', step, manager.directory, some_paths(bad), moved)
      skipped = True
      continue
    if not problem:
      if problems or skipped:
        logging.warning('Resuming from step %d, the newest good checkpoint.', step)
      return state
    problems.append(f'step {step}: {problem}')
    moved = _move_aside(manager, step)
    logging.warning('The checkpoint at step %d in %s is damaged (%s): moved to %s.', step,
                    manager.directory, problem, moved)
  if problems:
    raise errors.CheckpointError(
        f'No checkpoint in {manager.directory} can be restored: {"; ".join(problems)}. They '
        f'are in {manager.directory / BAD}. Train from the start in a new workdir (or '
        'fine-tune from a release file with config.init_from).')
  return None


def _recorded_nonfinite(step_dir: epath.Path) -> list[str]:
  """The arrays that the record of ``step_dir`` says are not finite ([] where it cannot be
  read: the restore finds that)."""
  try:
    return nonfinite(recorded(step_dir))
  except errors.CheckpointError:
    return []


def _leaves(tree: Any) -> dict[str, Any]:
  return {sharding.path_name(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def read_problem(e: BaseException, step_dir: epath.Path) -> str:
  """What went wrong reading a checkpoint, in a line naming the damaged file where known.

  Orbax wraps TensorStore's error (which names the array chunk) in an exception whose
  text is a dump of the TensorStore spec: the innermost error is the one that says. A file
  every restore needs that is not there is named as such (Orbax's own text quotes a repr).
  """
  if missing := [name for name in _NEEDED if not (step_dir / name).exists()]:
    what = 'folder' if missing[0] == 'default' else 'file'
    return f'its {what} {step_dir / missing[0]} is missing'
  inner = causes(e)[-1]
  problem = errors.short(inner)
  match = re.search(r'Error reading "([^"]+)" in OCDBT database at local file "([^"]+)"',
                    str(inner))
  if match:
    where = _chunk_file(epath.Path(match.group(2)), match.group(1))
    if where:
      problem += f' (the chunk is in {where})'
  return problem


def causes(e: BaseException) -> list[BaseException]:
  """``e`` and the errors it was raised from (or while handling), innermost last."""
  chain = [e]
  while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
    chain.append(chain[-1].__cause__ or chain[-1].__context__)
  return chain


def damaged(e: BaseException, step_dir: epath.Path) -> bool:
  """Whether the failure ``e`` to read the checkpoint in ``step_dir`` is its files' fault: a
  file every restore needs is missing, one could not be read (an OSError), a metadata file
  does not parse, or TensorStore found one cut short, missing or failing its checksum. Only
  then is a checkpoint moved aside: any other error (Orbax refusing what it was asked) says
  nothing about the files."""
  if not all((step_dir / name).exists() for name in _NEEDED):
    return True
  return any(isinstance(c, (OSError, json.JSONDecodeError, UnicodeDecodeError))
             or (isinstance(c, ValueError) and _FILE_STATUS.match(str(c))) for c in causes(e))


def _chunk_file(database: epath.Path, key: str) -> str:
  """The data file of OCDBT ``database`` that holds ``key``'s value ('' if not known)."""
  try:
    import tensorstore as ts

    kvstore = ts.KvStore.open(f'file://{database}/').result()
    root = ts.ocdbt.dump(kvstore).result()['versions'][-1]['root']['location']
    for entry in ts.ocdbt.dump(kvstore, root).result()['entries']:
      if entry['key'].decode() == key and 'indirect_value' in entry:
        # 'value:ocdbt.process_0/:d/FILE:OFFSET:LENGTH'
        prefix, name = entry['indirect_value'][len('value:'):].split(':')[:2]
        return str(database / prefix / name)
  except Exception:  # Only a better message: the tree itself may be what is damaged.
    pass
  return ''


def _restore_verified(manager: ocp.CheckpointManager, abstract_state: Any,
                      step: int) -> tuple[Any, str, list[str]]:
  """(state, '', its non-finite paths) or (None, its problem, []); the same on every
  process."""
  step_dir = epath.Path(manager.directory) / str(step)

  def read(arrays: dict[str, dict[str, Any]] | None) -> Any:
    _check_fits(arrays, abstract_state, step_dir)
    return manager.restore(step, args=ocp.args.StandardRestore(abstract_state))

  return _read_verified(step_dir, read)


def _ema_index(opt_state: Any) -> int | None:
  """Where ``optim.weight_ema``'s state sits in a checkpoint's optimizer-state chain."""
  for i, entry in enumerate(opt_state if isinstance(opt_state, (list, tuple)) else ()):
    if isinstance(entry, dict) and set(entry) == {'ema'}:
      return i
  return None


def has_ema(step_dir: epath.Path) -> bool:
  """Whether the checkpoint in ``step_dir`` keeps the weights' moving average."""
  step_dir = paths.absolute(step_dir)
  try:
    tree = ocp.PyTreeCheckpointHandler().metadata(step_dir / 'default').tree
  except Exception:  # Unreadable metadata: no average to be had.
    return False
  return _ema_index(tree.get('opt_state')) is not None


def restore_params(step_dir: epath.Path, mesh: jax.sharding.Mesh | None = None, *,
                   ema: bool = False) -> tuple[Any, str]:
  """(the parameters of the checkpoint in ``step_dir``, '') or (None, its problem).

  Only the parameters are read (not the optimizer state); with ``ema``, the weights'
  moving average instead (``optim.weight_ema``, in the parameters' layout; a checkpoint
  without one is an ``errors.CheckpointMismatchError``). With ``mesh`` they are placed
  on it, sharded by ``vit_jax.base.sharding``'s rules whatever mesh they were saved from;
  without, as numpy arrays on the host.
  """
  step_dir = paths.absolute(step_dir)

  def wrap(tree: Any, index: int | None) -> dict[str, Any]:
    """The path of the arrays in the train state, as their checksums are recorded."""
    return {'params': tree} if index is None else {'opt_state': [None] * index + [{'ema': tree}]}

  def unwrap(tree: dict[str, Any], index: int | None) -> Any:
    return tree['params'] if index is None else tree['opt_state'][index]['ema']

  index = None

  def read(arrays: dict[str, dict[str, Any]] | None) -> Any:
    nonlocal index
    tree = ocp.PyTreeCheckpointHandler().metadata(step_dir / 'default').tree
    if ema:
      index = _ema_index(tree.get('opt_state'))
      if index is None:
        raise errors.CheckpointMismatchError(
            f'{step_dir.parent.parent} (step {step_dir.name}) keeps no moving average of the '
            'weights: its run had config.optimizer.ema_decay=0. Leave out --ema '
            '(config.init_ema).')
    metadata = unwrap(tree, index)
    if mesh is None:
      abstract = jax.tree.map(lambda m: 0, metadata)
      restore_args = jax.tree.map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
    else:
      shapes = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), metadata)
      abstract = abstract_like(shapes, sharding.shardings_for(shapes, mesh))
      restore_args = ocp.checkpoint_utils.construct_restore_args(abstract)
    with ocp.PyTreeCheckpointer() as checkpointer:
      restored = checkpointer.restore(step_dir / 'default', args=ocp.args.PyTreeRestore(
          item=wrap(abstract, index), restore_args=wrap(restore_args, index),
          partial_restore=True))
    return wrap(unwrap(restored, index), index)

  tree, problem, _ = _read_verified(step_dir, read)
  return (None, problem) if problem else (unwrap(tree, index), '')


def _read_verified(step_dir: epath.Path, read: Callable[[dict[str, dict[str, Any]] | None], Any]
                   ) -> tuple[Any, str, list[str]]:
  """The one restore-and-verify path: ``read(record)`` restores (part of) the checkpoint in
  ``step_dir``, then every array read is checked against the checksums recorded when it was
  written. (tree, '', the paths read that are not finite) or (None, the problem, []), the
  same on every process."""
  tree, arrays, problem, refused = None, None, '', ''
  cannot = f'The checkpoint at step {step_dir.name} in {step_dir.parent} cannot be restored'
  console.silence_abandoned_reads()
  try:
    arrays = recorded(step_dir)
    tree = read(arrays)
  except NOT_DAMAGE:
    raise  # Another model's state (the config changed), or no memory: nothing is damaged.
  except errors.CheckpointError as e:
    problem = str(e)
  except Exception as e:
    problem = read_problem(e, step_dir)
    if not damaged(e, step_dir):
      refused = (f'{cannot}: {problem}. Nothing says its files are damaged (none is missing or '
                 'unreadable), so it is left where it is: the error is the checkpoint '
                 'library\'s (Orbax). Fix what it names, then run the command again.')
    elif arrays is None and (step_dir / STEP_METADATA).exists():
      # No record to tell damage from another model's state: leave it where it is.
      refused = (f'{cannot}: {problem}. It was written by an older vit_jax (no checksums), so '
                 'it is left where it is: resume with the config it was trained with, or move '
                 'it away to fall back to the one before.')
  failed = _most(2 if refused else 1 if problem else 0)  # The same answer on every process.
  if failed == 2:
    raise errors.CheckpointError(refused or f'{cannot} by another process (see its log); it is '
                                 'left where it is.')
  if failed and not problem:
    problem = 'another process could not read it (see its log)'
  bad = []
  if not problem:  # Collective, so only once every process holds the state.
    problem, bad = verify(tree, arrays, step_dir)
  return (None, problem, []) if problem else (tree, '', bad)


def _check_fits(arrays: dict[str, dict[str, Any]] | None, abstract_state: Any,
                step_dir: epath.Path) -> None:
  """Raises CheckpointMismatchError if the record holds other paths, shapes or dtypes."""
  if arrays is None:
    return
  saved = {p: f'{a["dtype"]}{a["shape"]}' for p, a in arrays.items()}
  wanted = {p: f'{np.dtype(x.dtype).name}{list(x.shape)}'
            for p, x in _leaves(abstract_state).items()}
  differ = sorted(p for p in saved.keys() | wanted.keys() if saved.get(p) != wanted.get(p))
  if differ:
    detail = '; '.join(f'{p}: saved {saved.get(p, "none")}, this config {wanted.get(p, "none")}'
                       for p in differ[:2])
    raise errors.CheckpointMismatchError(
        f'The checkpoint at step {step_dir.name} in {step_dir.parent} holds another model or '
        f'optimizer than this config makes ({len(differ)} arrays differ; {detail}). Resume with '
        'the config it was trained with (config.json in the workdir) or train in a new workdir.')


def _most(value: int) -> int:
  """The largest of every process's ``value``, on every process."""
  if jax.process_count() == 1:
    return value
  return int(np.max(multihost_utils.process_allgather(np.int32(value))))


def _move_aside(manager: ocp.CheckpointManager, step: int, folder: str = BAD) -> epath.Path:
  """Moves ``checkpoints/STEP`` to ``checkpoints/FOLDER/STEP`` (``BAD`` or ``NONFINITE``;
  process 0; all wait)."""
  directory = epath.Path(manager.directory)
  target = directory / folder / str(step)
  n = 1
  while target.exists():  # The same step went bad before (a run resumed, then damaged again).
    target, n = directory / folder / f'{step}.{n}', n + 1
  if jax.process_count() > 1:  # Every process named the target before it is taken.
    multihost_utils.sync_global_devices(f'vit_jax: moving checkpoint {step} aside')
  if jax.process_index() == 0:
    target.parent.mkdir(parents=True, exist_ok=True)
    (directory / str(step)).rename(target)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f'vit_jax: checkpoint {step} moved aside')
  manager.reload()
  return target


def abstract_like(tree: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs of ``tree`` carrying ``shardings``: the target of a restore."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)
