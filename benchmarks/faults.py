r"""The long fault test: a run killed with SIGKILL at random steps, N times, then finished.

    python -m benchmarks.faults --runs=10 --out=results/faults.json

The quickstart recipe, checkpointing asynchronously, is killed with ``kill -9`` at a random step
1 to 3 checkpoint intervals after where it resumed (every other time just after a save began),
restarted, ``--runs`` times, then run to the end. A fault is survived when the restart resumed
from the newest checkpoint complete before the kill; data is lost when a complete checkpoint
could not be used, or when the final state or a logged loss differs from an uninterrupted run's.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np
from absl import flags

from vit_jax.base import paths

_RUNS = flags.DEFINE_integer('runs', 10, 'How many times the run is killed.')
_STEPS = flags.DEFINE_integer('steps', 200, 'Steps of the run.')
_CHECKPOINT_EVERY = flags.DEFINE_integer('checkpoint_every', 20, 'Steps between checkpoints.')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the steps at which it is killed.')
_WORK_DIR = paths.DEFINE_path('work_dir', '/tmp/vit_jax_faults', 'Where the runs go.')
_OUT = paths.DEFINE_path('out', '', 'JSON file for the results.')
_SET = flags.DEFINE_multi_string(
    'set', [], 'More config overrides, FIELD=VALUE (e.g. model.num_layers=2): a smaller run '
    'for a quick check, as the tests do.')

CONFIG = 'configs/quickstart.py'
_RESUMED = re.compile(r'Resumed from \S+ at step (\d+)\.')
_STEP = re.compile(r'^step (\d+)/', re.M)  # The console's lines (no absl prefix).


def overrides() -> dict[str, Any]:
  """The quickstart recipe, shorter, checkpointed often, every step logged."""
  more = dict(item.split('=', 1) for item in _SET.value)
  return {'total_steps': _STEPS.value, 'schedule.warmup_steps': 10, 'log_every_steps': 1,
          'eval_every_steps': 0, 'checkpoint_every_steps': _CHECKPOINT_EVERY.value,
          'keep_checkpoints': 3, **more}


def start(workdir: str, log: str) -> subprocess.Popen:
  command = [sys.executable, '-m', 'vit_jax.main', f'--config={CONFIG}', f'--workdir={workdir}',
             *(f'--config.{k}={v}' for k, v in overrides().items())]
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'TF_CPP_MIN_LOG_LEVEL': '3'}
  with open(log, 'w') as f:
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=f, env=env)


def rows(workdir: str) -> list[dict[str, Any]]:
  """The lines of metrics.jsonl (a line cut short by a kill is skipped)."""
  path = pathlib.Path(workdir) / 'metrics.jsonl'
  out = []
  for line in path.read_text().splitlines() if path.exists() else []:
    with contextlib.suppress(json.JSONDecodeError):
      out.append(json.loads(line))
  return out


def logged_step(log: str) -> int:
  """The last step the process writing ``log`` reported (its progress line, every step)."""
  steps = _STEP.findall(pathlib.Path(log).read_text())
  return int(steps[-1]) if steps else 0


def checkpoints(workdir: str) -> list[str]:
  directory = os.path.join(workdir, 'checkpoints')
  return os.listdir(directory) if os.path.isdir(directory) else []


def wait(process: subprocess.Popen, condition: Any, what: str, timeout: float = 600) -> bool:
  """Polls ``condition`` until true (True) or the process ends (False)."""
  start_time = time.time()
  while not condition():
    if process.poll() is not None:
      return False
    if time.time() - start_time > timeout:
      raise TimeoutError(f'{what}: nothing after {timeout} s')
    time.sleep(0.02)
  return True


def final_state(workdir: str) -> Any:
  import jax

  from vit_jax.checkpoints.run import manager as manager_lib
  from vit_jax.config import cli as config_cli
  from vit_jax.training import plan as plan_lib

  config = config_cli.load(CONFIG, [(k, str(v)) for k, v in overrides().items()])
  plan = plan_lib.validate(config)
  state, shardings = plan.train_state()
  manager = manager_lib.make_manager(workdir, every_steps=1, keep=3)
  try:
    return jax.device_get(manager_lib.restore(
        manager, manager_lib.abstract_like(state, shardings)))
  finally:
    manager.close()


def losses(workdir: str) -> list[tuple[int, float]]:
  return [(row['step'], row['train/loss']) for row in rows(workdir) if 'train/loss' in row]


def kill_and_restart(processes: list[subprocess.Popen], workdir: str,
                     rng: np.random.Generator) -> list[dict[str, Any]]:
  """Kills the run --runs times at random steps, restarting it each time (``processes``)."""
  faults, position, log = [], 0, os.path.join(_WORK_DIR.value, 'faulty.0.log')
  for i in range(_RUNS.value):
    if position + 1 >= _STEPS.value:
      break
    # 1 to 3 checkpoint intervals after where it resumed, so that the kills spread over
    # the run; every other one the step after a save started, so that some hit saves.
    every = _CHECKPOINT_EVERY.value
    target = position + int(rng.integers(1, 3 * every))
    if i % 2 and target // every * every > position:
      target = target // every * every + 1
    target = min(target, _STEPS.value - 1)
    if not wait(processes[-1], lambda t=target, log=log: logged_step(log) >= t, f'step {target}'):
      raise RuntimeError(f'the run ended before step {target}: see {_WORK_DIR.value}')
    complete = [int(n) for n in checkpoints(workdir) if n.isdigit()]
    saving = any('tmp' in n for n in checkpoints(workdir))
    killed_at = logged_step(log)
    processes[-1].send_signal(signal.SIGKILL)
    processes[-1].wait()
    log = os.path.join(_WORK_DIR.value, f'faulty.{i + 1}.log')
    processes.append(start(workdir, log))
    text = pathlib.Path(log).read_text
    resumed = wait(processes[-1], lambda t=text: _RESUMED.search(t()) or 'step 1/' in t(),
                   'restart')
    match = _RESUMED.search(text()) if resumed else None
    position = int(match.group(1)) if match else 0
    newest, damaged = max(complete, default=0), 'is damaged' in text()
    faults.append({'killed_after_step': killed_at, 'newest_complete_checkpoint': newest,
                   'during_a_save': saving, 'resumed_at': position, 'damage_reported': damaged,
                   'survived': position >= newest and not damaged})
    print(json.dumps(faults[-1]), flush=True)
  return faults


def main(argv: list[str]) -> None:
  del argv
  import jax

  from benchmarks import results
  from vit_jax.base import errors
  from vit_jax.base.cpu import host_cpu
  from vit_jax.config import cli as config_cli

  bad = [item for item in _SET.value if '=' not in item]
  if bad:
    raise errors.UserError(f'--set={bad[0]} is not FIELD=VALUE (e.g. --set=model.num_layers=2).')
  config_cli.load(CONFIG, [(k, str(v)) for k, v in overrides().items()])  # Refused here if bad.
  load = os.getloadavg()
  shutil.rmtree(_WORK_DIR.value, ignore_errors=True)
  os.makedirs(_WORK_DIR.value)
  reference, faulty = (os.path.join(_WORK_DIR.value, n) for n in ('reference', 'faulty'))
  started = time.time()
  if start(reference, reference + '.log').wait():
    raise RuntimeError(f'the uninterrupted run failed: see {reference}.log')
  reference_seconds = time.time() - started

  rng = np.random.default_rng(_SEED.value)
  processes = [start(faulty, os.path.join(_WORK_DIR.value, 'faulty.0.log'))]
  try:
    faults = kill_and_restart(processes, faulty, rng)
    if processes[-1].wait():
      raise RuntimeError(f'the last restart failed: see {_WORK_DIR.value}')
  finally:
    processes[-1].kill()  # Not left running when this script stops early.

  a, b = final_state(reference), final_state(faulty)
  bitwise = all(np.array_equal(x, y) for x, y in
                zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))
  expected = dict(losses(reference))
  loss_mismatches = sum(expected[s] != loss for s, loss in losses(faulty))
  lost = sum(f['resumed_at'] < f['newest_complete_checkpoint'] for f in faults)
  summary = {'faults_tried': len(faults), 'survived': sum(f['survived'] for f in faults),
             'during_a_save': sum(f['during_a_save'] for f in faults),
             'checkpoints_lost': lost, 'final_state_bitwise_equal': bitwise,
             'loss_mismatches': loss_mismatches,
             'data_lost': lost + (not bitwise) + (loss_mismatches > 0),
             'steps_recomputed': sum(f['killed_after_step'] - f['resumed_at'] for f in faults),
             'uninterrupted_run_seconds': round(reference_seconds, 1)}
  print(f'faults tried {summary["faults_tried"]} ({summary["during_a_save"]} during a save), '
        f'survived {summary["survived"]}, data lost {summary["data_lost"]} (final state bitwise '
        f'equal to an uninterrupted run: {bitwise}; loss mismatches: {loss_mismatches}).')
  if _OUT.value:
    results.write(_OUT.value, 'benchmarks.faults', host_cpu.cpu_info(), load,
                  config={'config': CONFIG, **overrides()}, faults=faults, **summary)


if __name__ == '__main__':
  from vit_jax.base import errors

  errors.run(main)
