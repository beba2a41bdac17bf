r"""Entry point: ``python -m vit_jax.main --config=configs/quickstart.py --workdir=DIR``.

Any config field can be overridden on the command line (``--config.batch_size=256``,
``--config.model.image_size='(16, 24)'``: ``vit_jax.config.cli``). A user error (a bad
config, a missing file, a checkpoint that does not fit) ends the run with one line,
``error: ...``, and exit status 2 (``vit_jax.base.errors``). The log is vit_jax's own lines
(one per ``log_every_steps``, each evaluation, a closing summary); ``--verbosity=0``
(absl's flag) adds the INFO lines of Orbax, jax, clu and TensorFlow.
On Cloud TPU and SLURM, ``jax.distributed`` finds the other processes by itself;
elsewhere pass ``--coordinator_address``, ``--num_processes`` and ``--process_id``
to every process.
"""

from __future__ import annotations

import os

from absl import app, flags, logging

from vit_jax import config as config_lib
from vit_jax.base import console, errors, paths
from vit_jax.config import cli as config_cli

_CONFIG = config_cli.DEFINE_config('config', 'Training config file.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints and logs.')
_COORDINATOR = flags.DEFINE_string('coordinator_address', None,
                                   'host:port of process 0, for multi-process runs.')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Number of processes.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process\'s index.')
_DISTRIBUTED = flags.DEFINE_bool(
    'distributed', None, 'Call jax.distributed.initialize() (default: when the flags above '
    'are given, or on a Cloud TPU VM / SLURM job).')
_CPU_DEVICES = flags.DEFINE_integer(
    'cpu_devices', None, 'Split a CPU host into this many devices (data-parallel, one per core '
    'is fastest on a CPU-only machine: results/RESULTS.md; 2 or more also keep freed '
    'memory, VIT_JAX_MALLOC=keep_freed: vit_jax/base/cpu/); unset: jax\'s default (one, '
    'or XLA_FLAGS=--xla_force_host_platform_device_count=N).')
flags.mark_flags_as_required(['config', 'workdir'])


def _auto_distributed() -> bool:
  return bool(os.environ.get('SLURM_JOB_ID') or os.environ.get('TPU_WORKER_HOSTNAMES')
              or os.environ.get('CLOUD_TPU_TASK_ID'))


def main(argv: list[str]) -> None:
  config = _CONFIG.value  # Its errors first, before anything starts.
  config_lib.check(config_lib.complete(config))  # Types, None, ranges (train.validate's).
  paths.output_dir(_WORKDIR.value)  # Then the workdir's, before jax and TensorFlow start.
  if config.get('init_from'):
    paths.input_path(config.init_from, 'config.init_from', 'release .npz file or workdir')
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if _CPU_DEVICES.value is not None and _CPU_DEVICES.value < 1:
    raise errors.ConfigError(f'--cpu_devices={_CPU_DEVICES.value} must be a number of devices '
                             '>= 1 (or left out: jax\'s default).')
  malloc = console.start(_CPU_DEVICES.value)  # May re-execute this process once (XLA:CPU).
  import jax

  explicit = _COORDINATOR.value is not None
  distributed = _DISTRIBUTED.value if _DISTRIBUTED.value is not None else (
      explicit or _auto_distributed())
  if distributed:
    jax.distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  log_file = console.log_file(_WORKDIR.value, jax.process_index())
  if malloc:
    logging.info('XLA:CPU: malloc %s (VIT_JAX_MALLOC; GLIBC_TUNABLES=%r).', malloc,
                 os.environ.get('GLIBC_TUNABLES', ''), extra=console.FILE_ONLY)
  logging.info('Process %d of %d; %d local / %d global devices (%s).', jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count(),
               jax.devices()[0].platform)
  logging.info('Log with timestamps and third-party lines: %s', log_file)

  from vit_jax.training import train

  train.train_and_evaluate(config, _WORKDIR.value)


if __name__ == '__main__':
  config_cli.run(main)
