r"""What the checkpoint checksums cost: save and restore of a model's train state, with and without.

    python -m benchmarks.integrity --model=b16 --out=results/integrity.json

The state is the model's parameters and Adam's two moments. Each save is timed until it is on
disk and until the run may go on (the copy to host memory, ``blocking``), each restore until
the arrays are on the devices: with vit_jax's checksums (``manager_lib.save`` / ``restore``) and
with Orbax alone, alternately, ``--repeats`` times; the medians, and the checksums by themselves
(``checksum.of``, after its first call compiled it).
"""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
from absl import flags

from vit_jax.base import paths

_MODEL = flags.DEFINE_string('model', 'b16', 'A model of the zoo (vit_jax.models).')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Measurements per cell; the median is reported.')
_WORK_DIR = paths.DEFINE_path('work_dir', '/tmp/vit_jax_integrity', 'Where checkpoints go.')
_OUT = paths.DEFINE_path('out', '', 'JSON file for the results.')


def main(argv: list[str]) -> None:
  del argv
  import jax
  import orbax.checkpoint as ocp

  from benchmarks import results
  from vit_jax import config as config_lib
  from vit_jax.base import sharding
  from vit_jax.base.cpu import host_cpu
  from vit_jax.checkpoints.run import checksum
  from vit_jax.checkpoints.run import manager as manager_lib
  from vit_jax.models import get_model
  from vit_jax.training import optim
  from vit_jax.training import step as train_step

  load = os.getloadavg()
  model = get_model(_MODEL.value, num_classes=1000)
  config = config_lib.get_config()  # Adam, as the paper's pre-training.
  tx = optim.make_optimizer(config.optimizer, optim.make_schedule(config.schedule, 100, 10))
  state, shardings = train_step.create_train_state(model, tx, 0, sharding.make_mesh())
  abstract = manager_lib.abstract_like(state, shardings)
  size = sum(x.nbytes for x in jax.tree.leaves(state))

  start = time.perf_counter()
  checksum.of(state)
  first = time.perf_counter() - start
  sums = []
  for _ in range(_REPEATS.value):
    start = time.perf_counter()
    checksum.of(state)
    sums.append(time.perf_counter() - start)

  def timed_save(verified: bool, step: int) -> tuple[float, float]:
    directory = os.path.join(_WORK_DIR.value, 'verified' if verified else 'plain')
    manager = manager_lib.make_manager(directory, every_steps=1, keep=1)
    start = time.perf_counter()
    if verified:
      manager_lib.save(manager, step, state, force=True)
    else:
      manager.save(step, args=ocp.args.StandardSave(state), force=True)
    blocking = time.perf_counter() - start
    manager.wait_until_finished()
    total = time.perf_counter() - start
    manager.close()
    return blocking, total

  def timed_restore(verified: bool) -> float:
    directory = os.path.join(_WORK_DIR.value, 'verified' if verified else 'plain')
    manager = manager_lib.make_manager(directory, every_steps=1, keep=1)
    start = time.perf_counter()
    if verified:
      restored = manager_lib.restore(manager, abstract)
    else:
      restored = manager.restore(manager.latest_step(), args=ocp.args.StandardRestore(abstract))
    jax.block_until_ready(restored)
    seconds = time.perf_counter() - start
    manager.close()
    return seconds

  shutil.rmtree(_WORK_DIR.value, ignore_errors=True)
  cells = {k: [] for k in ('save_blocking', 'save', 'restore')}
  runs = {verified: {k: [] for k in cells} for verified in (True, False)}
  for step in range(_REPEATS.value):
    for verified in (True, False):  # Alternately, so that drifts of the machine hit both.
      blocking, total = timed_save(verified, step)
      runs[verified]['save_blocking'].append(blocking)
      runs[verified]['save'].append(total)
      runs[verified]['restore'].append(timed_restore(verified))
  shutil.rmtree(_WORK_DIR.value, ignore_errors=True)

  rows = {}
  for cell in cells:
    with_sums, plain = (float(np.median(runs[v][cell])) for v in (True, False))
    rows[cell] = {'with_checksums_s': round(with_sums, 2), 'orbax_alone_s': round(plain, 2),
                  'added_s': round(with_sums - plain, 2)}
    print(f'{cell:>14}: {with_sums:6.2f} s with checksums, {plain:6.2f} s without '
          f'({with_sums - plain:+.2f} s)')
  steady = float(np.median(sums))
  print(f'checksums alone: {steady:.2f} s ({size / steady / 1e9:.2f} GB/s; the first call, '
        f'compiling, {first:.1f} s) for {size / 1e9:.2f} GB in {len(jax.tree.leaves(state))} '
        f'arrays of {model.model_name} and Adam.')
  if _OUT.value:
    results.write(_OUT.value, 'benchmarks.integrity', host_cpu.cpu_info(), load,
                  model=model.model_name, state_bytes=size, devices=jax.device_count(),
                  checksums_s=round(steady, 3), checksums_first_call_s=round(first, 2),
                  runs={str(v): runs[v] for v in runs}, **rows)


if __name__ == '__main__':
  from vit_jax.base import errors

  errors.run(main)  # Flag mistakes and user errors as one line, exit status 2.
