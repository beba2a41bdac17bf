r"""Input throughput: vit_jax's pipeline against a plain tf.data one, on the same images.

    python -m vit_jax.benchmarks.input --data=../shared/data/imagenette_224 \
        --out=results/input.json

The data is converted to the local format first (into --work_dir, once). Both
pipelines decode the same JPEG bytes and apply the same operations:
  train: decode, inception crop (area 5%-100%, aspect 3/4-4/3) to 224, random flip,
         values to [-1, 1];
  eval:  decode, resize the shorter side to 256, central crop 224, values to [-1, 1].
Each measurement runs in its own process pinned to 1 core (images/s per core) or to
all cores, with as many workers as cores.
tf.data reads the JPEG files with ``tf.io.read_file``, as the existing projects'
pipelines do; vit_jax reads its ArrayRecord shards.

Two stages are measured for each:
  host:   batches in host memory. tf.data's are float32; vit_jax's are uint8, because
          its loader runs the trailing value_range on the devices;
  device: batches as float32 jax.Arrays on the (first) device, ready: vit_jax's
          ``iterate()``, and tf.data's batches put there with ``jax.device_put``. The
          comparison of the whole work, wherever each pipeline does it.
"""

from __future__ import annotations

import json
import os
import platform
import time

import numpy as np
from absl import flags
from etils import epath

_DATA = flags.DEFINE_string('data', '../shared/data/imagenette_224', 'An image folder.')
_SPLIT = flags.DEFINE_string('split', 'train', 'Split of the folder to read.')
_WORK_DIR = flags.DEFINE_string('work_dir', '/tmp/vit_jax_input_benchmark',
                                'Where the converted copy goes.')
_IMAGES = flags.DEFINE_integer('images', 4096, 'Images per measurement.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Measurements per cell; the median is reported.')
_BATCH = flags.DEFINE_integer('batch_size', 128, 'Batch size.')
_OUT = flags.DEFINE_string('out', '', 'JSON file for the results.')
_PIPELINES = flags.DEFINE_list('pipelines', ['train', 'eval'], 'Pipelines to measure.')

PIPELINES = {
    'train': 'decode|inception_crop(224)|flip_lr|value_range(-1, 1)',
    'eval': 'decode|resize_small(256)|central_crop(224)|value_range(-1, 1)',
}


def vit_jax_rate(directory: str, split: str, pipeline: str, workers: int, images: int,
                 batch: int, stage: str) -> float:
  """Images/s of vit_jax's loader (threads decode in parallel) at ``stage``."""
  import jax

  from vit_jax import sharding
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
                                'measurement in this (pinned) process, printed as JSON.')
IMPLS = ('vit_jax', 'tf_data')
STAGES = ('host', 'device')


def _measure_pinned(directory: str, impl: str, stage: str, pipeline: str,
                    workers: int) -> float:
  """Runs one measurement in a child process pinned to ``workers`` cores."""
  import subprocess
  import sys

  cores = sorted(os.sched_getaffinity(0))[:workers]
  command = [sys.executable, '-m', 'vit_jax.benchmarks.input', f'--data={_DATA.value}',
             f'--split={_SPLIT.value}', f'--work_dir={_WORK_DIR.value}',
             f'--images={_IMAGES.value}', f'--batch_size={_BATCH.value}',
             f'--measure={impl}:{stage}:{pipeline}:{workers}']
  env = {**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '3', 'JAX_PLATFORMS': 'cpu'}
  done = subprocess.run(command, capture_output=True, text=True, check=False, env=env,
                        preexec_fn=lambda: os.sched_setaffinity(0, cores))
  if done.returncode:
    raise RuntimeError(f'{impl} {stage} {pipeline} failed:\n{done.stderr[-3000:]}')
  return json.loads(done.stdout.strip().splitlines()[-1])['images_per_s']


def main(argv: list[str]) -> None:
  del argv
  converted = str(epath.Path(_WORK_DIR.value) / 'local')
  if _MEASURE.value:
    impl, stage, pipeline, workers = _MEASURE.value.split(':')
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


if __name__ == '__main__':
  from vit_jax import errors

  errors.run(main)  # Flag mistakes and user errors as one line, exit status 2.
