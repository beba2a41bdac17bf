r"""NaViT packing against padding each image to the budget: training throughput at one budget.

    python -m benchmarks.packing --data=/tmp/imagenette_mixed --out=results/packing.json

Both cells train the same model on the same mixed-size, mixed-aspect images (a local dataset,
e.g. ``vit_jax.tools.crops`` of Imagenette), each at its native resolution
(``naflex(P, N, 'pil_bilinear', False)``: an image within the budget is not enlarged), in
sequences of the same budget of N tokens: *pad*, one image a sequence, padded to N; *pack*,
up to ``--images_per_row`` images a sequence (NaViT's greedy packer, ``vit_jax.data.packing``:
an image that does not fit in what is left of its row is dropped). The step is the run's
(``plan.train_step``) on the run's loader's batches, prepared before the timing: the step
alone is timed. Per cell: images/s (the images the step learns from: neither a dropped image
nor an empty slot), useful tokens/s (image patches, not padding), the padding's share of the
tokens and the dropped images' share.

On this machine's CPU: ``--model`` (ViT-Ti/16 by default), ``--rows`` sequences a step,
``--steps`` timed steps after compilation and one warm-up. Per the TPU compiler's cost model
(``--topology``, no TPU needed): the same step of ``--tpu_model`` with ``--tpu_rows``
sequences per device, its images and tokens a row those of the CPU cell's batches.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from absl import flags

from vit_jax.base import errors, paths


def cells() -> list[tuple[str, int]]:
  """(name, images a row): 'pad', then a packed cell for each ``--images_per_row``."""
  return [('pad', 0)] + [(f'pack {k}', int(k)) for k in flags.FLAGS.images_per_row]


def _define_flags() -> None:
  paths.DEFINE_path('data', None, 'A local dataset (vit_jax.data.convert) of mixed-size images.')
  flags.DEFINE_integer('patch_size', 16, 'Patch size (naflex and the model).')
  flags.DEFINE_integer('budget', 256, 'Tokens a sequence: naflex\'s max_num_patches, the packed '
                       'rows\' seq_len.')
  flags.DEFINE_list('images_per_row', ['3', '4'], 'Images a packed row takes at most: a pack '
                    'cell each.')
  flags.DEFINE_string('model', 'ti16', 'The CPU cells\' model (vit_jax.models), pooled by gap.')
  flags.DEFINE_integer('rows', 8, 'Sequences a CPU step.')
  flags.DEFINE_integer('steps', 5, 'Timed CPU steps a cell.')
  flags.DEFINE_string('topology', 'v5p-8', 'The TPU slice of the cost-model cells ("none": '
                      'none).')
  flags.DEFINE_string('tpu_model', 'b16', 'The TPU cells\' model.')
  flags.DEFINE_integer('tpu_rows', 64, 'Sequences per TPU device a step.')
  paths.DEFINE_path('out', None, 'Write the results here (JSON).')


def cell_config(k: int, data: str, model: str, batch_size: int) -> Any:
  """A run's config: ``batch_size`` images in sequences of the budget, ``k`` a row (0:
  unpacked)."""
  from vit_jax import config as config_lib

  f = flags.FLAGS
  pp = (f"decode|flip_lr|naflex({f.patch_size}, {f.budget}, 'pil_bilinear', False)"
        '|value_range(-1, 1)')
  return config_lib.complete({
      'model': {'name': model, 'pool': 'gap', 'patch_size': f.patch_size},
      'dataset': {'name': 'mixed', 'data_dir': data, 'pp_train': pp, 'pp_eval': pp,
                  'eval_split': 'val'},
      'packing': {'images_per_row': k, 'seq_len': f.budget if k else 0},
      'batch_size': batch_size, 'eval_batch_size': batch_size, 'total_steps': 1000,
      'schedule': {'warmup_steps': 10}, 'input_workers': 2})


def measure_cpu(cell: str, k: int) -> dict[str, Any]:
  """Times the run's step on its loader's batches on this machine's devices."""
  import jax
  import numpy as np

  from vit_jax.base import sharding
  from vit_jax.data import loader
  from vit_jax.training import plan as plan_lib

  f = flags.FLAGS
  config = cell_config(k, f.data, f.model, f.rows * max(k, 1))
  plan = plan_lib.validate(config)
  state, shardings = plan.train_state()
  step = plan.train_step(shardings)
  train = loader.TrainLoader(plan.train_source, plan.pp_train, global_batch_size=config.batch_size,
                             seed=0, sharding=sharding.batch_sharding(plan.mesh),
                             num_classes=plan.num_classes, packing=plan.packing)
  stream = train.iterate()
  batches = [batch for _, (_, batch) in zip(range(f.steps + 2), stream, strict=False)]
  stream.close()
  images = [int(np.sum(b['image_mask'])) if 'image_mask' in b else f.rows for b in batches]
  tokens = [int(np.sum(b['patch_mask'])) for b in batches]
  start = time.perf_counter()
  state, metrics = step(state, batches[0])
  jax.block_until_ready(metrics)
  compile_seconds = time.perf_counter() - start
  state, metrics = step(state, batches[1])  # Warm-up.
  jax.block_until_ready(metrics)
  times = []
  for batch in batches[2:]:
    start = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  seconds = statistics.median(times)
  timed_images, timed_tokens = images[2:], tokens[2:]
  return {'cell': cell, 'model': f.model, 'rows': f.rows, 'images_per_row': k or 1,
          'seq_len': f.budget, 'batch_images': config.batch_size,
          'images_per_step': statistics.mean(timed_images),
          'tokens_per_step': statistics.mean(timed_tokens),
          'step_seconds': seconds, 'compile_seconds': compile_seconds,
          'images_per_second': sum(timed_images) / sum(times),
          'tokens_per_second': sum(timed_tokens) / sum(times),
          'padding_share': 1 - sum(timed_tokens) / (len(times) * f.rows * f.budget),
          'dropped_share': 1 - sum(timed_images) / (len(times) * config.batch_size),
          'loss': float(metrics['loss']), 'num_classes': plan.num_classes}


def measure_tpu(cell: str, k: int, cpu: dict[str, Any]) -> dict[str, Any]:
  """The cost model's step time of ``cell`` on ``--topology``; images and tokens a row as the
  CPU cell's batches hold them."""
  from vit_jax.base import accelerators
  from vit_jax.tools import planner

  f = flags.FLAGS
  tpu = accelerators.tpu_slice(f.topology)
  devices = tpu.compile_devices()
  rows = f.tpu_rows * len(devices)
  config = cell_config(k, f.data, f.tpu_model, rows * max(k, 1))
  config.model.dtype = 'bfloat16'
  config.dataset.num_classes = cpu['num_classes']  # Planned without the data.
  facts = planner.compile_steps(config, devices, 100_000, only_train=True)
  seconds = facts['train'].get('step_seconds')
  per_row = cpu['images_per_step'] / cpu['rows'], cpu['tokens_per_step'] / cpu['rows']
  return {'cell': cell, 'topology': tpu.name, 'model': f.tpu_model, 'rows': rows,
          'images_per_row': cpu['images_per_row'], 'seq_len': f.budget,
          'cost_model_step_seconds': seconds,
          'hbm_bytes_per_device': facts['train'].get('hbm_bytes_per_device'),
          'images_per_second': seconds and rows * per_row[0] / seconds,
          'tokens_per_second': seconds and rows * per_row[1] / seconds}


def main(argv: list[str]) -> None:
  del argv
  f = flags.FLAGS
  data = paths.input_path(f.data, 'data', 'local dataset')
  if not os.path.isfile(os.path.join(paths.local(data), 'metadata.json')):
    raise errors.MissingFileError(f'--data={data} is not a local dataset (no metadata.json): '
                                  'make one with python -m vit_jax.data.convert.')
  if not all(k.isdigit() and int(k) > 0 for k in f.images_per_row):
    raise errors.UserError(f'--images_per_row={",".join(f.images_per_row)}: positive integers.')
  if min(f.patch_size, f.budget, f.rows, f.steps, f.tpu_rows) <= 0:
    raise errors.UserError('--patch_size, --budget, --rows, --steps and --tpu_rows must be '
                           'positive.')
  if f.out:
    paths.output_path(f.out, 'out')
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  from benchmarks import results
  from vit_jax.base.cpu import host_cpu

  load = os.getloadavg()
  print(f'Packing against padding: {f.model}, sequences of {f.budget} tokens of '
        f'{f.patch_size} px patches, {f.rows} a step, native resolution; {data}.')
  header = (f'{"cell":7} {"where":24} {"img/row":>8} {"pad %":>6} {"drop %":>6} '
            f'{"step ms":>9} {"img/s":>9} {"tokens/s":>10}')
  print(header)
  cpu_rows, tpu_rows = [], []
  for cell, k in cells():
    row = measure_cpu(cell, k)
    cpu_rows.append(row)
    print(f'{cell:7} {"this CPU":24} {row["images_per_step"] / row["rows"]:8.2f} '
          f'{100 * row["padding_share"]:6.1f} {100 * row["dropped_share"]:6.1f} '
          f'{1e3 * row["step_seconds"]:9.1f} {row["images_per_second"]:9.1f} '
          f'{row["tokens_per_second"]:10.0f}', flush=True)
  if f.topology != 'none':
    for (cell, k), cpu in zip(cells(), cpu_rows, strict=True):
      row = measure_tpu(cell, k, cpu)
      tpu_rows.append(row)
      where = f'{row["topology"]} {row["model"]} (cost model)'
      seconds = row['cost_model_step_seconds']
      print(f'{cell:7} {where:24} {cpu["images_per_step"] / cpu["rows"]:8.2f} '
            f'{100 * cpu["padding_share"]:6.1f} {100 * cpu["dropped_share"]:6.1f} '
            f'{1e3 * seconds if seconds else float("nan"):9.1f} '
            f'{row["images_per_second"] or float("nan"):9.0f} '
            f'{row["tokens_per_second"] or float("nan"):10.0f}', flush=True)
  if f.out:
    results.write(f.out, 'benchmarks.packing', cpu=host_cpu.cpu_info(), load=load,
                  data=data, cpu_cells=cpu_rows, tpu_cells=tpu_rows)


if __name__ == '__main__':
  _define_flags()
  errors.run(main, arguments=False)
