r"""Entry point: ``python -m vit_jax.main --config=configs/quickstart.py --workdir=DIR``.

Any config field can be overridden on the command line (``--config.batch_size=256``,
``--config.model.image_size='(16, 24)'``: ``vit_jax.config.cli``). A user error (a bad
config, a missing file, a checkpoint that does not fit) ends the run with one line,
``error: ...``, and exit status 2 (``vit_jax.base.errors``). ``--verbosity=0`` (absl's flag)
adds the INFO lines of Orbax, jax, clu and TensorFlow to vit_jax's own. On Cloud TPU and
SLURM, ``jax.distributed`` finds the other processes by itself; elsewhere pass
``--coordinator_address``, ``--num_processes`` and ``--process_id`` to every process. When
one process of such a run stops answering, the others end with one line naming it and the step
the run resumes from, exit status 69 (``vit_jax.base.peers``; the launch scripts' ``--restarts``).
SIGTERM or Ctrl-C while it trains saves a checkpoint at the next step and exits with status 75; a
second Ctrl-C, or one before it trains, stops at once, status 130 (``vit_jax.training.loop``).
"""

from __future__ import annotations

import functools
import os
from typing import Any

from absl import app, flags, logging

from vit_jax import config as config_lib
from vit_jax.base import console, cpu, errors, paths, peers, sizes
from vit_jax.checkpoints import headers, hf_hub
from vit_jax.checkpoints.run import lock, record
from vit_jax.config import cli as config_cli
from vit_jax.data import sources

# The command's seam: above it, the checks of its command line (this module's imports need no
# jax); the plan, the evaluators and the loop import jax, so only ``prepare`` and
# ``train_and_evaluate`` import them, when a run starts.


def prepare(config: Any) -> tuple[Any, list[Any]]:
  """The config validated (``vit_jax.training.plan.validate``: the data, the model, a
  damaged ``init_from``) and its evaluators (``config.evals``) built and checked, before
  anything compiles or is written: (plan, evaluators). ``vit_jax.sweep`` and ``vit_jax.vtab``
  run it for every run before the first starts."""
  from vit_jax import evals  # jax from here on (the seam, above).
  from vit_jax.training import plan as plan_lib  # jax from here on (the seam, above).

  plan = plan_lib.validate(config)
  return plan, evals.from_config(evals.Context.from_plan(plan))


def train_and_evaluate(config: Any, workdir: str,
                       prepared: tuple[Any, list[Any]] | None = None) -> dict[str, float]:
  """What ``python -m vit_jax.main`` runs, and ``vit_jax.sweep`` and ``vit_jax.vtab`` for
  each of their runs: ``prepare`` (unless ``prepared``: its result); then, before anything is
  written in the workdir, its lock taken (one run per workdir; the command takes it first of
  all) and a resume's config compared with the run's (the same trajectory); then the
  training loop. Returns the last metrics."""
  from vit_jax.training import loop  # jax from here on (the seam, above).

  plan, evaluators = prepared or prepare(config)
  with lock.hold(workdir):
    record.check_resume(workdir, config)
    return loop.train_and_evaluate(plan, workdir, evaluators)


def _define_flags() -> dict[str, Any]:
  """The command line's flags (defined when run as a program, not when imported)."""
  f = flags
  defined = dict(
      config=config_cli.DEFINE_config('config', 'Training config file.'),
      workdir=paths.DEFINE_path('workdir', None, 'Directory for checkpoints and logs.'),
      coordinator_address=f.DEFINE_string('coordinator_address', None,
                                          'host:port of process 0, for multi-process runs.'),
      num_processes=f.DEFINE_integer('num_processes', None, 'Number of processes.'),
      process_id=f.DEFINE_integer('process_id', None, 'This process\'s index.'),
      distributed=f.DEFINE_bool(
          'distributed', None, 'Call jax.distributed.initialize() (default: when the flags '
          'above are given, or on a Cloud TPU VM / SLURM job).'),
      peer_timeout=f.DEFINE_float(
          'peer_timeout', peers.TIMEOUT_S, 'Multi-process: seconds without a heartbeat after '
          'which another process is taken as gone, and this one exits with status 69.'),
      cpu_devices=f.DEFINE_integer(
          'cpu_devices', None, 'Split a CPU host into this many devices (data-parallel, one '
          'per core is fastest on a CPU-only machine: results/RESULTS.md; 2 or more also keep '
          'freed memory, VIT_JAX_MALLOC=keep_freed: vit_jax/base/cpu/); unset: jax\'s default '
          '(one, or XLA_FLAGS=--xla_force_host_platform_device_count=N).'),
  )
  f.mark_flags_as_required(['config', 'workdir'])
  return defined


def main(argv: list[str], flags_: dict[str, Any]) -> None:
  """``run``, with Ctrl-C before the loop saves (start-up, a second Ctrl-C while it saves) as
  one line saying what was saved, exit status 130 (``errors.Interrupted``)."""
  try:
    run(argv, flags_)
  except KeyboardInterrupt:
    steps = record.steps(flags_['workdir'].value)
    raise errors.Interrupted(
        f'Stopped by Ctrl-C: nothing saved past step {steps[-1]}, the newest checkpoint; run '
        'the same command again to resume from it.' if steps else 'Stopped by Ctrl-C before '
        'any checkpoint was saved.') from None


def run(argv: list[str], flags_: dict[str, Any]) -> None:
  """The command: its checks before jax, then the run."""
  config = flags_['config'].value  # Its errors first, before anything starts.
  config_lib.check(config_lib.complete(config))  # Types, None, ranges (the plan's).
  workdir = flags_['workdir'].value
  paths.output_dir(workdir)  # Then the workdir's, before jax and TensorFlow start.
  checkpoint_sources = {'init_from': config.get('init_from'),
                        'distill.teacher': (config.get('distill') or {}).get('teacher')}
  for field, source in checkpoint_sources.items():
    if source and not source.startswith('hf-hub:'):
      paths.input_path(source, f'config.{field}', 'checkpoint (docs/checkpoints.md)')
  data_dir = config.dataset.data_dir  # A local one now; a bucket is read once TensorFlow starts.
  if data_dir and not config.dataset.prepare:
    paths.input_path(data_dir, 'config.dataset.data_dir', 'data folder')
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  cpu_devices = flags_['cpu_devices'].value
  if cpu_devices is not None and cpu_devices < 1:
    raise errors.ConfigError(f'--cpu_devices={cpu_devices} must be a number of devices '
                             '>= 1 (or left out: jax\'s default).')
  if flags_['peer_timeout'].value <= 0:
    raise errors.ConfigError(f'--peer_timeout={flags_["peer_timeout"].value} must be a number '
                             'of seconds > 0.')
  coordinator, distributed = flags_['coordinator_address'].value, flags_['distributed'].value
  if distributed is None:  # The flags above given, or a Cloud TPU VM or SLURM job.
    distributed = coordinator is not None or any(os.environ.get(k) for k in (
        'SLURM_JOB_ID', 'TPU_WORKER_HOSTNAMES', 'CLOUD_TPU_TASK_ID'))
  # One process on the CPU: its device count is known before jax, so are the mesh's and the
  # batches' fit (the plan checks them again for any run, on the devices jax makes).
  if not distributed and cpu.runs_on_cpu() and (devices := cpu.device_count(cpu_devices)):
    data, fsdp, _ = sizes.mesh_shape(config.mesh, devices)
    sizes.check_batches(config, data * fsdp)
  for field, source in checkpoint_sources.items():  # Fetched, or found in the cache, before jax.
    if source:  # A damaged or partial .npz or safetensors file: its header says, before jax.
      headers.check_file(hf_hub.resolve(source) if hf_hub.is_hub_id(source) else source, field)
  sources.check_name(config.dataset)  # What needs no data, before jax: nothing written yet.
  sources.check_fewshot_names(config)
  if not distributed:  # A job's process 0 may hold the lock already: it is taken below.
    lock.check_free(workdir)
  record.check_resume(workdir, config)
  malloc = console.start(cpu_devices)  # May re-execute this process once (XLA:CPU).
  import jax  # Every check above is done: jax starts here.

  if distributed:
    peers.start(coordinator, flags_['num_processes'].value, flags_['process_id'].value,
                timeout_s=flags_['peer_timeout'].value, resumes_from=lambda: _resumes_from(workdir))
  try:
    prepared = prepare(config)  # Its refusals before the lock and the log file: nothing written.
    with lock.hold(workdir):  # Before anything is written there: one run per workdir.
      log_file = console.log_file(workdir, jax.process_index())
      if malloc:
        logging.info('XLA:CPU: malloc %s (VIT_JAX_MALLOC; GLIBC_TUNABLES=%r).', malloc,
                     os.environ.get('GLIBC_TUNABLES', ''), extra=console.FILE_ONLY)
      logging.info('Process %d of %d; %d local / %d global devices (%s).', jax.process_index(),
                   jax.process_count(), jax.local_device_count(), jax.device_count(),
                   jax.devices()[0].platform)
      logging.info('Log with timestamps and third-party lines: %s', log_file)
      train_and_evaluate(config, workdir, prepared)
  except Exception as e:
    if isinstance(e, _PEER_FAILURES) or not isinstance(e, (errors.UserError, errors.Preempted)):
      peers.verdict()  # A collective that failed for a peer that is gone: one line, exit 69.
    raise
  finally:
    peers.finish()


# Errors that a peer gone may cause (a save's barrier fails): the watchdog's verdict first.
_PEER_FAILURES = (errors.CheckpointSaveError, errors.MetricsWriteError)


def _resumes_from(workdir: str) -> str:
  """Where a restart of the run in ``workdir`` starts: its newest complete checkpoint."""
  steps = record.steps(workdir)
  return f'step {steps[-1]}, its newest checkpoint' if steps else 'step 0 (no checkpoint yet)'


if __name__ == '__main__':
  config_cli.run(functools.partial(main, flags_=_define_flags()))
