r"""Input throughput: vit_jax's pipeline against a plain tf.data one, on the same images.

    python -m benchmarks.input --data=../shared/data/imagenette_224 --out=results/input.json
    python -m benchmarks.input --recipes=shipped --out=results/input_recipes.json

The first converts the images to the local format once (into ``--work_dir``) and runs the same
train and eval pipelines in both, each measurement in a process pinned to 1 core or to all, to
host batches and to float32 batches ready on the device. ``--recipes`` runs each distinct
``dataset.pp_train`` of the configs through ``TrainLoader`` as ``vit_jax.main`` builds it (host
batches, keyed by the pipeline string): the rates ``vit_jax.tools.feeding`` reads. The method
and the results: results/RESULTS.md ("Input pipeline").
"""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Any

import numpy as np
from absl import flags
from etils import epath

from vit_jax.base import paths

_DATA = paths.DEFINE_path('data', '../shared/data/imagenette_224', 'An image folder.')
_SPLIT = flags.DEFINE_string('split', 'train', 'Split of the folder to read.')
_WORK_DIR = paths.DEFINE_path('work_dir', '/tmp/vit_jax_input_benchmark',
                              'Where the converted copy goes.')
_IMAGES = flags.DEFINE_integer('images', 4096, 'Images per measurement.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Measurements per cell; the median is reported.')
_BATCH = flags.DEFINE_integer('batch_size', 128, 'Batch size.')
_OUT = paths.DEFINE_path('out', '', 'JSON file for the results.')
_PIPELINES = flags.DEFINE_list('pipelines', ['train', 'eval'], 'Pipelines to measure.')
_RECIPES = flags.DEFINE_list(
    'recipes', [], "Measure these configs' training pipelines instead (config files as "
    "--config takes them, 'configs/vit_i1k_augreg.py:b16'; 'shipped': SHIPPED_RECIPES).")

# Every shipped recipe that trains on images (the CPU-sized ones aside).
SHIPPED_RECIPES = (
    'configs/vit_b16_i1k.py', 'configs/vit_l16_i21k.py', 'configs/vit_jft_like.py:b16',
    'configs/vit_b16_mpp.py:jft_like', 'configs/vit_G14_jft_like.py',
    'configs/vit_22b_jft_like.py', 'configs/vit_b16_finetune.py:imagenet2012',
    'configs/vit_i1k_augreg.py:ti16', 'configs/vit_i1k_augreg.py:b16',
    'configs/vit_s16_i1k_plain.py', 'configs/deit_s16_i1k.py')
ROOT = epath.Path(__file__).parents[2]

PIPELINES = {
    'train': 'decode|inception_crop(224)|flip_lr|value_range(-1, 1)',
    'eval': 'decode|resize_small(256)|central_crop(224)|value_range(-1, 1)',
}


def vit_jax_rate(directory: str, split: str, pipeline: str, workers: int, images: int,
                 batch: int, stage: str) -> float:
  """Images/s of vit_jax's loader (threads decode in parallel) at ``stage``."""
  import jax

  from vit_jax.base import sharding
  from vit_jax.data import loader, local, preprocess

  source = local.LocalSource(directory, split)
  train_loader = loader.TrainLoader(
      source, preprocess.parse(PIPELINES[pipeline]), global_batch_size=batch, seed=0,
      sharding=sharding.batch_sharding(sharding.make_mesh(None, jax.devices()[:1])),
      num_classes=source.num_classes, num_workers=workers, prefetch=workers)
  steps = images // batch
  batches = (train_loader.iterate_local(0) if stage == 'host'
             else train_loader.iterate(0))
  jax.block_until_ready(next(batches))  # Warm-up (and compilation).
  start = time.perf_counter()
  for _ in range(steps):
    jax.block_until_ready(next(batches))
  elapsed = time.perf_counter() - start
  batches.close()
  return steps * batch / elapsed


def recipe_config(spec: str):
  """A config as ``--config`` loads it (paths relative to here, else to the project)."""
  from vit_jax.config import cli as config_cli

  path, colon, arg = spec.partition(':')
  if not epath.Path(path).exists() and (ROOT / path).exists():
    path = str(ROOT / path)
  return config_cli.load(path + colon + arg)


def recipe_loader(config, directory: str, split: str, workers: int, batch: int):
  """``TrainLoader`` as ``vit_jax.training.loop`` builds it for ``config``, over the
  local-format copy at ``directory``, with ``workers`` threads and one batch in flight each."""
  import jax

  from vit_jax.base import sharding
  from vit_jax.data import loader, local, preprocess

  source = local.LocalSource(directory, split)
  return loader.TrainLoader(
      source, preprocess.parse(config.dataset.pp_train), global_batch_size=batch,
      seed=config.seed, sharding=sharding.batch_sharding(sharding.make_mesh(None,
                                                                            jax.devices()[:1])),
      num_classes=source.num_classes, num_workers=workers, prefetch=workers,
      repeats=config.dataset.repeats)


def recipe_rate(spec: str, directory: str, split: str, workers: int, images: int,
                batch: int) -> dict[str, float]:
  """Host images/s of config ``spec``'s training pipeline (``iterate_local``), by the clock
  and per CPU-second of this process (all its threads): the rate of cores that are its
  alone, which the clock does not give on a shared machine."""
  train_loader = recipe_loader(recipe_config(spec), directory, split, workers, batch)
  batches = train_loader.iterate_local(0)
  next(batches)  # Warm-up.
  steps = images // batch
  start, cpu = time.perf_counter(), time.process_time()
  for _ in range(steps):
    next(batches)
  elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
  batches.close()
  return {'images_per_s': steps * batch / elapsed, 'images_per_cpu_s': steps * batch / cpu}


def tf_data_rate(folder: str, split: str, pipeline: str, workers: int, images: int,
                 batch: int, stage: str) -> float:
  """Images/s of the same operations as a tf.data pipeline over the JPEG files."""
  import tensorflow as tf

  files = sorted(str(p) for p in epath.Path(folder, split).glob('*/*'))

  def train_op(path):
    data = tf.io.read_file(path)
    shape = tf.io.extract_jpeg_shape(data)
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape, tf.zeros([0, 0, 4]), area_range=(0.05, 1.0), aspect_ratio_range=(3 / 4, 4 / 3),
        min_object_covered=0, use_image_if_no_bounding_boxes=True)
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    image = tf.image.decode_and_crop_jpeg(data, window, channels=3)
    image = tf.image.resize(image, (224, 224))
    image = tf.image.random_flip_left_right(image)
    return image / 127.5 - 1

  def eval_op(path):
    image = tf.io.decode_jpeg(tf.io.read_file(path), channels=3)
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = 256 / tf.reduce_min(shape)
    image = tf.image.resize(image, tf.cast(tf.round(shape * scale), tf.int32))
    image = tf.image.resize_with_crop_or_pad(image, 224, 224)
    return image / 127.5 - 1

  op = train_op if pipeline == 'train' else eval_op
  dataset = (tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=0).repeat()
             .map(op, num_parallel_calls=workers, deterministic=True).batch(batch)
             .prefetch(workers))
  options = tf.data.Options()
  options.threading.private_threadpool_size = workers
  options.autotune.enabled = False
  iterator = iter(dataset.with_options(options))
  if stage == 'device':
    import jax

    device = jax.devices()[0]
    batches = (jax.block_until_ready(jax.device_put(b.numpy(), device)) for b in iterator)
  else:
    batches = iterator
  next(batches)
  steps = images // batch
  start = time.perf_counter()
  for _ in range(steps):
    next(batches)
  return steps * batch / (time.perf_counter() - start)


_MEASURE = flags.DEFINE_string('measure', '', 'Internal: IMPL:STAGE:PIPELINE:WORKERS, one '
                                'measurement in this (pinned) process, printed as JSON '
                                '(IMPL recipe: PIPELINE is a config, with its colon).')
IMPLS = ('vit_jax', 'tf_data')
STAGES = ('host', 'device')


def _measure_pinned(directory: str, impl: str, stage: str, pipeline: str, workers: int,
                    key: str = 'images_per_s') -> Any:
  """Runs one measurement in a child process pinned to ``workers`` cores: its ``key``
  (None: its whole answer)."""
  import subprocess
  import sys

  cores = sorted(os.sched_getaffinity(0))[:workers]
  command = [sys.executable, '-m', 'benchmarks.input', f'--data={_DATA.value}',
             f'--split={_SPLIT.value}', f'--work_dir={_WORK_DIR.value}',
             f'--images={_IMAGES.value}', f'--batch_size={_BATCH.value}',
             f'--measure={impl}:{stage}:{pipeline}:{workers}']
  env = {**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3', 'JAX_PLATFORMS': 'cpu'}
  done = subprocess.run(command, capture_output=True, text=True, check=False, env=env,
                        preexec_fn=lambda: os.sched_setaffinity(0, cores))
  if done.returncode:
    raise RuntimeError(f'{impl} {stage} {pipeline} failed:\n{done.stderr[-3000:]}')
  answer = json.loads(done.stdout.strip().splitlines()[-1])
  return answer if key is None else answer[key]


def main(argv: list[str]) -> None:
  del argv
  converted = str(epath.Path(_WORK_DIR.value) / 'local')
  if _MEASURE.value:
    impl, stage, rest = _MEASURE.value.split(':', 2)
    pipeline, workers = rest.rsplit(':', 1)
    if impl == 'recipe':
      print(json.dumps(recipe_rate(pipeline, converted, _SPLIT.value, int(workers),
                                   _IMAGES.value, _BATCH.value)))
      return
    if impl == 'vit_jax':
      rate = vit_jax_rate(converted, _SPLIT.value, pipeline, int(workers), _IMAGES.value,
                          _BATCH.value, stage)
    else:
      rate = tf_data_rate(_DATA.value, _SPLIT.value, pipeline, int(workers), _IMAGES.value,
                          _BATCH.value, stage)
    print(json.dumps({'images_per_s': rate}))
    return

  from vit_jax.data import convert

  convert.convert(_DATA.value, converted, shards=8)
  cores = len(os.sched_getaffinity(0))
  if _RECIPES.value:
    _measure_recipes(converted, cores)
    return
  rows = []
  for pipeline in _PIPELINES.value:
    for workers in sorted({1, cores}):
      for stage in STAGES:
        # Alternate the two, so that slow drifts of the machine hit both alike.
        runs = {impl: [] for impl in IMPLS}
        for _ in range(_REPEATS.value):
          for impl in IMPLS:
            runs[impl].append(_measure_pinned(converted, impl, stage, pipeline, workers))
        ours, theirs = (float(np.median(runs[impl])) for impl in IMPLS)
        rows.append({'pipeline': pipeline, 'cores': workers, 'stage': stage, 'runs': runs,
                     'vit_jax_images_per_s': ours, 'tf_data_images_per_s': theirs,
                     'vit_jax_per_core': ours / workers, 'tf_data_per_core': theirs / workers,
                     'ratio': ours / theirs})
  print(f'\nInput throughput on {_DATA.value} ({_SPLIT.value}), batch {_BATCH.value}, '
        f'median of {_REPEATS.value} x {_IMAGES.value} images, {platform.machine()}; each '
        'measurement in its own process pinned to its cores. host: batches in host memory '
        '(vit_jax: uint8, scaled later on the device); device: float32 batches ready on '
        'the device.')
  print(f'{"pipeline":9}{"cores":>6}{"stage":>8}{"vit_jax img/s":>15}{"tf.data img/s":>15}'
        f'{"vit_jax/core":>14}{"tf.data/core":>14}{"ratio":>7}')
  for r in rows:
    print(f'{r["pipeline"]:9}{r["cores"]:>6}{r["stage"]:>8}{r["vit_jax_images_per_s"]:>15.0f}'
          f'{r["tf_data_images_per_s"]:>15.0f}{r["vit_jax_per_core"]:>14.0f}'
          f'{r["tf_data_per_core"]:>14.0f}{r["ratio"]:>7.2f}')
  if _OUT.value:
    result = {'data': _DATA.value, 'split': _SPLIT.value, 'batch_size': _BATCH.value,
              'images': _IMAGES.value, 'repeats': _REPEATS.value,
              'date': time.strftime('%Y-%m-%d'), 'rows': rows}
    epath.Path(_OUT.value).parent.mkdir(parents=True, exist_ok=True)
    epath.Path(_OUT.value).write_text(json.dumps(result, indent=1))
    print(f'wrote {_OUT.value}')


def _measure_recipes(converted: str, cores: int) -> None:
  """``--recipes``: each distinct training pipeline of the configs, per host core."""
  from vit_jax.tools import feeding

  specs = list(SHIPPED_RECIPES) if _RECIPES.value == ['shipped'] else _RECIPES.value
  pipelines: dict[str, dict] = {}
  for spec in specs:
    config = recipe_config(spec)
    entry = pipelines.setdefault(feeding.pipeline_key(config.dataset.pp_train), {
        'pipeline': config.dataset.pp_train, 'spec': spec, 'recipes': []})
    entry['recipes'].append({
        'config': spec, 'repeats': config.dataset.repeats, 'mixup_alpha': config.mixup_alpha,
        'cutmix_alpha': config.cutmix_alpha,
        'mix_runs_on': ('chips (train step)' if config.mixup_alpha or config.cutmix_alpha
                        else None)})
  counts = sorted({1, cores})
  for entry in pipelines.values():
    entry['cells'] = []
    for workers in counts:
      runs = [_measure_pinned(converted, 'recipe', 'host', entry['spec'], workers, None)
              for _ in range(_REPEATS.value)]
      rate = float(np.median([r['images_per_s'] for r in runs]))
      cpu_rate = float(np.median([r['images_per_cpu_s'] for r in runs]))
      entry['cells'].append({'cores': workers, 'runs': runs, 'images_per_second': rate,
                             'images_per_second_per_core': rate / workers,
                             'images_per_cpu_second': cpu_rate})
    # Per core: images per CPU-second (what a core of its own gives; the clock's rate is
    # other processes' too on a shared machine), the lower of the core counts measured.
    entry['images_per_second_per_core'] = min(c['images_per_cpu_second']
                                              for c in entry['cells'])
    entry['cores_measured'] = '/'.join(str(c) for c in counts)
    entry['data_name'] = (f'{epath.Path(_DATA.value).name} ({_SPLIT.value}), '
                          f'{platform.machine()}, {time.strftime("%Y-%m-%d")}')
  print(f'\nTraining pipelines of the recipes on {_DATA.value} ({_SPLIT.value}): host '
        f'images/s (uint8 batches of {_BATCH.value}, before a trailing value_range, which '
        f'runs on the chips), median of {_REPEATS.value} x {_IMAGES.value} images, each in a '
        'process pinned to its cores.')
  print(f'{"pipeline":72}{"cores":>6}{"img/s":>9}{"img/s/core":>12}{"img/CPU-s":>11}  '
        'recipes')
  for entry in pipelines.values():
    names = ', '.join(r['config'].removeprefix('configs/') for r in entry['recipes'])
    for cell in entry['cells']:
      print(f'{entry["pipeline"]:72}{cell["cores"]:>6}{cell["images_per_second"]:>9.0f}'
            f'{cell["images_per_second_per_core"]:>12.0f}'
            f'{cell["images_per_cpu_second"]:>11.0f}  {names}')
  if _OUT.value:
    result = {'data': _DATA.value, 'split': _SPLIT.value, 'batch_size': _BATCH.value,
              'images': _IMAGES.value, 'repeats': _REPEATS.value, 'stage': 'host',
              'machine': platform.machine(), 'date': time.strftime('%Y-%m-%d %H:%M'),
              'load_average': os.getloadavg(),
              'pipelines': pipelines}
    epath.Path(_OUT.value).parent.mkdir(parents=True, exist_ok=True)
    epath.Path(_OUT.value).write_text(json.dumps(result, indent=1))
    print(f'wrote {_OUT.value}')


if __name__ == '__main__':
  from vit_jax.base import errors

  errors.run(main)  # Flag mistakes and user errors as one line, exit status 2.
