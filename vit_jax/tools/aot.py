r"""Plan a run before renting the slice: compile its steps for a TPU topology, here.

    python -m vit_jax.tools.aot --config=configs/vit_l16_i21k.py --topology=v3-128
    python -m vit_jax.tools.aot --config=configs/vit_b16_i1k.py --topology=v4-32 \
        --config.batch_size=2048 --json=/tmp/b16.json

Compiles the train and eval steps ``vit_jax.main`` would run for the config (shapes only, no
data) for the named slice with libtpu, no TPU attached (``pip install -e ".[tpu]"``;
``--topology=cpu``: this host, sizes only): HBM per device, the cost model's step time, images/s,
MFU, chip-hours, and whether the hosts can feed it (``vit_jax.tools.feeding``). A plan that does
not fit exits with status 3 after printing the overrides that would fit. The cost model counts a
loop's body once, so scanned models and micro-batches get no step time. The compiles are
``vit_jax.tools.planner``'s.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import pathlib
import sys
import types
from typing import Any

from absl import flags
from etils import epath

from vit_jax.base import accelerators, errors, paths
from vit_jax.config import cli as config_cli
from vit_jax.data import sources
from vit_jax.tools import feeding


def _define_flags() -> types.SimpleNamespace:
  """The command line's flags (defined when run as a program, so that the functions below
  can be imported beside other programs' flags)."""
  names = types.SimpleNamespace(
      feeding=feeding.define_flags(),
      config=config_cli.DEFINE_config('config', 'Training config file.'),
      topology=flags.DEFINE_string(
          'topology', None, 'A Cloud TPU slice (v3-8, v4-32, v5p-128, v5litepod-16, v6e-256), '
          'a libtpu topology (v4:2x2x1), or "cpu" (this host\'s devices).'),
      json=paths.DEFINE_path('json', None, 'Also write the report as JSON to this file.'),
      max_batch=flags.DEFINE_bool(
          'max_batch', False, 'Find the largest global batch that fits (and plan that batch).'),
      memory_per_device=flags.DEFINE_float(
          'memory_per_device', None, 'The memory per device (GiB) the steps may take, for the '
          'fit and --max_batch: on a TPU, a cap below its HBM (default: the HBM, as the '
          'compiler decides); on --topology=cpu, none unless given (XLA:CPU compiles any '
          'batch). Also --max_batch_memory.'),
      max_compiles=flags.DEFINE_integer(
          'max_compiles', 8, 'The most train-step compiles --max_batch, or the largest batch '
          'suggested for a plan that does not fit, may take.'),
      suggest=flags.DEFINE_bool(
          'suggest', True, 'For a plan that does not fit, find and compile what would '
          '(--nosuggest: only the verdict).'),
      progress_every=flags.DEFINE_float(
          'progress_every', 30., 'Seconds between the lines that say what is being compiled '
          'and for how long.'),
      examples=flags.DEFINE_integer(
          'num_train_examples', None, 'Training examples per epoch, for schedules in epochs '
          '(default: the dataset\'s, where it is known here: TRAIN_EXAMPLES).'))
  flags.DEFINE_alias('max_batch_memory', 'memory_per_device')
  flags.mark_flags_as_required(['topology'])
  return names


# Training examples of the datasets the shipped configs name, for schedules in epochs.
TRAIN_EXAMPLES = {
    'imagenet2012': 1_281_167,
    # The release's fall11_whole.tar holds 14,197,122 images of 21,841 classes; the converter
    # keeps 2% for validation by default (vit_jax.data.convert --val_fraction).
    'imagenet21k': 13_913_180,
    'cifar10': 50_000, 'cifar100': 50_000, 'oxford_iiit_pet': 3_680, 'oxford_flowers102': 1_020,
}
# The exit status of a plan that does not fit (after the report and the suggestions): not a
# user error (2), not a bug (1).
DOES_NOT_FIT_STATUS = 3


def train_examples(config: Any, given: int | None) -> int:
  """Examples in ``dataset.train_split``: ``given``, or the dataset's known size, sliced."""
  if given:
    return given
  total = TRAIN_EXAMPLES.get(config.dataset.name)
  if total is None:
    raise errors.ConfigError(f'The size of dataset {config.dataset.name!r} is not known here: '
                             'pass --num_train_examples (or set config.total_steps).')
  split = config.dataset.train_split  # Sliced as TFDS slices it ('train[:99%]').
  try:
    _, part = sources.split_slice(split, total)
  except ValueError as e:
    raise errors.ConfigError(f'config.dataset.train_split: {e} Or pass '
                             '--num_train_examples.') from None
  return total if part is None else len(range(total)[part])


def check_flags(topology: str, limit: float | None, max_batch: bool, max_compiles: int,
                examples: int | None, json_path: str | None) -> Any:
  """The command line's own mistakes, before any heavy start-up: the TPU slice (None for
  'cpu') or a ``UserError`` naming the problem and the fix."""
  tpu = None
  if topology != 'cpu':
    try:
      tpu = accelerators.tpu_slice(topology)
    except ValueError as e:
      also = ' Or "cpu" (this host).' if str(e).startswith('Unknown') else ''
      raise errors.UserError(f'--topology={topology}: {e}{also}') from None
  if limit is not None and not (limit > 0 and math.isfinite(limit)):
    raise errors.UserError(f'--memory_per_device={limit} must be a positive number of GiB '
                           'per device (e.g. 15.5).')
  if max_batch and tpu is None and limit is None:
    raise errors.UserError('--max_batch on --topology=cpu needs --memory_per_device=GIB: '
                           'XLA:CPU compiles any batch, so nothing else bounds it.')
  if max_compiles < 2:
    raise errors.UserError(f'--max_compiles={max_compiles} must be at least 2 (a search '
                           'needs a batch that fits and one that does not).')
  if examples is not None and examples <= 0:
    raise errors.UserError(f'--num_train_examples={examples} must be positive.')
  if json_path and '://' not in json_path:  # A local folder (a bucket is written as it is).
    parent = pathlib.Path(json_path).parent
    if not parent.is_dir():
      raise errors.UserError(f'--json={json_path}: the folder {parent} does not exist; '
                             'create it, or name another file.')
  return tpu


def main(argv: list[str]) -> None:
  topology = _FLAGS.topology.value.strip().lower()
  limit, max_compiles = _FLAGS.memory_per_device.value, _FLAGS.max_compiles.value
  examples, json_path = _FLAGS.examples.value, _FLAGS.json.value
  check_flags(topology, limit, _FLAGS.max_batch.value, max_compiles, examples, json_path)
  progress_every = _FLAGS.progress_every.value
  if not progress_every > 0:
    raise errors.UserError(f'--progress_every={progress_every} must be a positive number of '
                           'seconds.')
  feeding.check_flags(_FLAGS.feeding)
  if topology != 'cpu':
    os.environ.setdefault('JAX_PLATFORMS', 'cpu')  # Never this host's TPU: only libtpu's compiler.
    if importlib.util.find_spec('libtpu') is None:
      raise errors.UserError('compiling for a TPU needs libtpu: pip install -e ".[tpu]" (or '
                             'use --topology=cpu).')
  config = _FLAGS.config.value
  # Training examples for the schedule: 0 where total_steps sets it; else the dataset's.
  examples = examples or (0 if config.get('total_steps') else train_examples(config, None))
  limit = limit and limit * 2**30
  from vit_jax.tools import planner  # The compiles: jax from here on (every check is above).

  planner.progress_every = progress_every
  if _FLAGS.max_batch.value:
    config, r = planner.largest_batch_report(config, topology, examples, limit, max_compiles)
  else:
    r = planner.report(config, topology, examples, limit)
  print(planner.format_report(r, _FLAGS.config.file.value))
  if fed := feeding.check(config, r, _FLAGS.feeding):  # Can the hosts feed the chips?
    print('\n'.join(fed['lines']))
    r['feeding'] = fed
  if not r['fits'] and _FLAGS.suggest.value:
    r['suggestions'] = planner.advise(config, topology, r, examples, limit, max_compiles)
    print(planner.format_advice(r['suggestions']))
  if json_path:
    epath.Path(json_path).write_text(json.dumps(r, indent=1))
  if not r['fits']:
    step = 'train' if not planner.within(r['train'], limit) else 'eval'
    need = planner.gib(planner.needed_bytes(r[step]))
    print(f'does not fit: the {step} step needs {need} per device on {r["topology"]}; exit '
          f'status {DOES_NOT_FIT_STATUS} (a plan, not an error).',
          file=sys.stderr, flush=True)
    sys.exit(DOES_NOT_FIT_STATUS)


if __name__ == '__main__':
  _FLAGS = _define_flags()
  config_cli.run(main, arguments=False)
