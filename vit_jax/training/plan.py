"""A run's plan: its config checked and resolved, before anything compiles.

``validate`` names the bad field of a config in one ``errors.UserError``; what it returns,
``Plan``, is everything the loop, the evaluators and the planner (``vit_jax.tools.aot``)
take from a config: the model, the data, the mesh, the schedule and the optimizer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
import optax
from absl import logging

from vit_jax import checkpoints
from vit_jax import config as config_lib
from vit_jax.base import cpu, errors, paths, sharding, sizes
from vit_jax.base.sizes import pair
from vit_jax.checkpoints import formats
from vit_jax.checkpoints.formats import big_vision, hub, release
from vit_jax.checkpoints.run import workdir as workdir_lib
from vit_jax.data import packing as packing_lib
from vit_jax.data import preprocess, sources
from vit_jax.models import flexi, get_model, mpp, naflex
from vit_jax.training import optim
from vit_jax.training import step as step_lib
from vit_jax.training.step import StepOptions


@dataclasses.dataclass(frozen=True)
class Plan:
  """What a validated config resolves to."""

  config: ml_collections.ConfigDict  # Complete: every field of vit_jax.config there.
  model: nn.Module
  train_source: Any  # None when planned without the data (num_train_examples).
  eval_source: Any
  num_classes: int
  total_steps: int
  warmup_steps: int
  mesh: jax.sharding.Mesh
  pp_train: preprocess.Pipeline
  pp_eval: preprocess.Pipeline
  schedule: optax.Schedule
  tx: optax.GradientTransformation
  teacher: step_lib.Teacher | None = None  # config.distill.teacher, loaded.
  packing: packing_lib.Packing | None = None  # config.packing (NaViT), where on.

  @property
  def step_options(self) -> StepOptions:
    return StepOptions.from_config(self.config)

  @property
  def class_names(self) -> tuple[str, ...]:
    """The training data's class names, () where it has none."""
    return tuple(getattr(self.train_source, 'class_names', ()))

  @property
  def shard_state(self) -> bool:
    """Whether the train state is stored split over the data axis: as
    ``config.mesh.shard_state`` says; where None, on TPUs and GPUs but not on CPUs."""
    if self.config.mesh.shard_state is None:
      return cpu.shards_state_by_default(self.mesh.devices.flat[0].platform)
    return self.config.mesh.shard_state

  def train_state(self, *, abstract: bool = False) -> tuple[step_lib.TrainState, Any]:
    """The run's fresh state (``config.seed``) laid out in its shardings, and the shardings;
    ``abstract``: only their shapes (planning, a restore's target)."""
    return step_lib.create_train_state(self.model, self.tx, self.config.seed, self.mesh,
                                       shard_state=self.shard_state, abstract=abstract)

  def train_step(self, state_shardings: Any) -> Callable | step_lib.PatchSizeSteps:
    """The run's jitted step over its mesh, for a state in ``state_shardings``; with
    ``config.flexi.patch_sizes``, one per patch size drawn per step (``PatchSizeSteps``)."""
    make = lambda patch_size=None: step_lib.make_train_step(
        self.model, self.tx, self.schedule, self.step_options, self.mesh, state_shardings,
        self.teacher, patch_size)
    if not self.config.flexi.patch_sizes:
      return make()
    return step_lib.PatchSizeSteps(make, self.config.seed, tuple(self.config.flexi.patch_sizes),
                                   tuple(self.config.flexi.probabilities))


def validate(config: ml_collections.ConfigDict, *, devices: list[jax.Device] | None = None,
             num_train_examples: int | None = None) -> Plan:
  """Checks a config and resolves it; raises ``errors.UserError`` naming the bad field.

  Fields the config leaves out take ``vit_jax.config``'s defaults. The preprocessing
  pipelines run once, on the first example of their split, to compare the size they make
  with the model's. ``devices``: the mesh's (default: all of this run's). With
  ``num_train_examples`` no data or file is opened (planning ahead of time): the plan has
  no sources, and ``dataset.num_classes`` must be set.
  """
  config = config_lib.complete(config)
  config_lib.check(config)  # Types, None, ranges: the declarations of vit_jax.config.
  name, options = config_lib.model_options(config.model)  # Its name: checked by check.
  self_supervised = mpp.is_on(config)  # Masked patch prediction: no label is read.
  with_data = num_train_examples is None
  if with_data:
    _check_files(config)
  specs = _scaled_pipelines(config, with_data)
  config.dataset.pp_eval = specs['pp_eval']  # config.json's: what predict and evaluate take.
  pipelines = {}
  for field, spec in specs.items():
    try:
      pipelines[field] = preprocess.parse(spec)
    except ValueError as e:
      raise errors.ConfigError(f'config.dataset.{field}: {e}') from None

  if config.eval_batch_size is None:
    config.eval_batch_size = config.batch_size
  mesh = sharding.make_mesh(config.mesh, devices)
  _check_batches(config, mesh)

  train_source = eval_source = None
  num_classes = int(config.dataset.num_classes)
  if with_data:
    try:
      train_source, eval_source = (sources.get_source(config.dataset, split) for split in (
          config.dataset.train_split, config.dataset.eval_split))
    except FileNotFoundError as e:
      raise errors.MissingFileError(f'config.dataset ({config.dataset.name!r}): {e}') from None
    except ValueError as e:
      raise errors.ConfigError(f'config.dataset ({config.dataset.name!r}): {e}') from None
    num_classes = num_classes or train_source.num_classes
    if not self_supervised and not train_source.num_classes:
      raise errors.ConfigError(
          f'config.dataset: {config.dataset.data_dir or config.dataset.name} has no labels. '
          "Pre-train on it without labels (config.objective='mpp'), or convert labelled data.")
    if not self_supervised and num_classes != train_source.num_classes:
      raise errors.ConfigError(f'config.dataset.num_classes={num_classes}, but the data has '
                               f'{train_source.num_classes} classes.')
    num_train_examples = len(train_source)
  elif not num_classes and not self_supervised:
    raise errors.ConfigError('config.dataset.num_classes is 0 (the data\'s): set it to plan '
                             'without the data.')
  if self_supervised:  # Labels ignored: a per-patch head instead of the classifier.
    num_classes = 0
  try:
    model = get_model(name, num_classes=num_classes, **options)
  except ValueError as e:
    raise errors.ConfigError(f'config.model: {e}') from None
  if self_supervised:
    model = mpp.pretraining_model(config, model)  # Checks config.mpp against the model.
  _check_image_size(model, config.model.image_size)
  if config.flexi.patch_sizes and (problem := flexi.check(model, config.flexi.patch_sizes)):
    raise errors.ConfigError(f'config.flexi.patch_sizes={tuple(config.flexi.patch_sizes)}: '
                             f'{problem}.')
  packing = _patch_sequences(config, pipelines, model, mesh)
  if with_data:
    for field, split, source in (('pp_train', config.dataset.train_split, train_source),
                                 ('pp_eval', config.dataset.eval_split, eval_source)):
      preprocess.check_output(pipelines[field], source[0]['image'], pair(model.image_size),
                              f'config.dataset.{field}', f'the first {split!r} example',
                              naflex.patch_size_of(model))
  total, warmup = optim.resolve_steps(config, num_train_examples)
  schedule, total = optim.with_phases(optim.make_schedule(config.schedule, total, warmup),
                                      total, config_lib.phases(config))
  tx = optim.make_optimizer(config.optimizer, schedule)
  teacher = _teacher(config, model, tuple(getattr(train_source, 'class_names', ())))
  return Plan(config, model, train_source, eval_source, num_classes, total, warmup, mesh,
              pipelines['pp_train'], pipelines['pp_eval'], schedule, tx, teacher, packing)


def _patch_sequences(config: ml_collections.ConfigDict, pipelines: dict[str, preprocess.Pipeline],
                     model: nn.Module, mesh: jax.sharding.Mesh) -> packing_lib.Packing | None:
  """NaFlex pipelines (``naflex``) checked against the model and the run's other options, and
  ``config.packing`` (NaViT) resolved: its ``Packing``, or None where it is off."""
  rows, train = config.packing.images_per_row, pipelines['pp_train']
  if rows and not train.patches:
    raise errors.ConfigError(
        f'config.packing.images_per_row={rows} packs patch sequences, but '
        f'config.dataset.pp_train={train.spec!r} makes images: end it with naflex(P, N)|'
        'value_range(-1, 1), or set config.packing.images_per_row=0.')
  for field, pipeline in pipelines.items():
    if not pipeline.patches:
      continue
    where = f'config.dataset.{field}={pipeline.spec!r} makes NaFlex patch sequences'
    if model.resnet_layers is not None:
      raise errors.ConfigError(f'{where}, but the model is a hybrid (a ResNet stem, '
                               'config.model.resnet_layers), which takes images: resize or crop '
                               'to config.model.image_size instead, or train a plain ViT.')
    if mpp.is_on(config):
      raise errors.ConfigError(f"{where}, but config.objective='mpp' predicts the masked "
                               'patches of images: resize or crop to config.model.image_size '
                               "instead, or set config.objective='classification'.")
    ours, theirs = pair(model.patch_size), pipeline.naflex.patch_size
    if ours != (theirs, theirs):
      raise errors.ConfigError(
          f'{where} of {theirs}x{theirs} patches, but the model\'s are {ours[0]}x{ours[1]} '
          f'(config.model.patch_size): use naflex({ours[0]}, '
          f'{pipeline.naflex.max_num_patches}) with a square patch_size.')
  if not train.patches:
    return None
  where = f'config.dataset.pp_train={train.spec!r} makes NaFlex patch sequences'
  if config.mixup_alpha or config.cutmix_alpha:
    raise errors.ConfigError(f'{where}, which mixup and CutMix cannot mix (they blend or cut '
                             'images of one size): set config.mixup_alpha=0 and '
                             'config.cutmix_alpha=0.')
  if config.distill.teacher:
    raise errors.ConfigError(f'{where}, but a distillation teacher (config.distill.teacher) '
                             'labels images: leave the teacher out, or train on images.')
  if config.flexi.patch_sizes:
    raise errors.ConfigError(f'{where} of one patch size, but config.flexi.patch_sizes='
                             f'{tuple(config.flexi.patch_sizes)} draws one a step: set '
                             'config.flexi.patch_sizes=(), or train FlexiViT on images.')
  if not rows:
    return None
  budget = train.naflex.max_num_patches
  seq_len = config.packing.seq_len or budget
  if seq_len < budget:
    raise errors.ConfigError(
        f'config.packing.seq_len={seq_len} is shorter than naflex\'s max_num_patches={budget} '
        f'(config.dataset.pp_train): an image of {budget} patches would never fit. Use '
        f'{budget} or more (0: {budget}).')
  devices = math.prod(mesh.shape[a] for a in sharding.BATCH_AXES)
  packed, accum = config.batch_size // rows, int(config.grad_accum_steps)
  if packed % devices or (packed // devices) % accum:
    unit = rows * devices * accum
    raise errors.ConfigError(
        f'config.batch_size={config.batch_size} packs into {packed} rows of '
        f'config.packing.images_per_row={rows}, which do not split over the {devices} devices '
        f'(config.mesh data x fsdp) and config.grad_accum_steps={accum}: use a multiple of '
        f'{unit}.')
  return packing_lib.Packing(rows, seq_len)


def _teacher(config: ml_collections.ConfigDict, model: nn.Module,
             class_names: tuple[str, ...]) -> step_lib.Teacher | None:
  """``config.distill.teacher`` loaded, checked to label the model's classes (by name where
  both have names) and to take the run's images: resized where only its size differs (the
  same aspect ratio), rescaled where its mean and std differ (exact, as timm's distillation
  does); else refused, naming both."""
  source = config.distill.teacher
  if not source:
    return None
  where = f'config.distill.teacher={source}'
  if not model.distill_token or mpp.is_on(config):
    raise errors.ConfigError(f'{where}, but the model has no distillation head to learn from '
                             'it: set config.model.distill_token=True, or leave the teacher out.')
  try:
    loaded = checkpoints.load(source)
  except errors.UserError as e:
    raise type(e)(f'config.distill.teacher: {e}') from None
  theirs, names = loaded.model.num_classes or 0, tuple(loaded.class_names)
  if theirs != model.num_classes or (names and class_names and names != class_names):
    described = lambda n, c: f'{n} classes' + (f' ({", ".join(c[:3])}, ...)' if c else '')
    raise errors.ConfigError(f'{where} labels {described(theirs, names)}, the data has '
                             f'{described(model.num_classes, class_names)}: name a teacher '
                             "trained on the data's classes.")
  run, size = pair(model.image_size), pair(loaded.model.image_size)
  (ours, ss, so), (its, ts, to) = [_scaling(spec) for spec in (
      config.dataset.pp_train,
      loaded.config.dataset.pp_eval if loaded.config else loaded.preprocessing.spec(size))]
  if run[0] * size[1] != run[1] * size[0] or not (ours and its):
    raise errors.ConfigError(
        f'{where} takes {size[0]}x{size[1]} images, {its or "unscaled"}; the run makes '
        f'{run[0]}x{run[1]}, {ours or "unscaled"} (config.dataset.pp_train): give the run '
        "the teacher's aspect ratio, and a value_range or normalize to both.")
  a, b = ts / ss, to - so * ts / ss  # Pixels p = (v - so) / ss; ts * p + to = a * v + b.
  rescale = None if np.allclose(a, 1) and np.allclose(b, 0) else (
      tuple(map(float, a)), tuple(map(float, b)))
  if done := ' and '.join(w for w, on in (('resized', size != run), ('rescaled', rescale)) if on):
    logging.info('Teacher %s: the run\'s %dx%d images (%s) are %s for it, to %dx%d (%s).',
                 source, *run, ours, done, *size, its)
  return step_lib.Teacher(loaded.params, loaded.model, rescale)


def _scaling(spec: str) -> tuple[str, np.ndarray, np.ndarray]:
  """The last ``value_range`` or ``normalize`` of a pipeline (its pixels to the model's values)
  and its scale and offset per channel; ('', 1, 0) where it has none."""
  op = preprocess.last_scaling(spec)
  affine = preprocess.parse(op).affine if op else (1., 0.)
  return op, *(np.broadcast_to(np.asarray(v, np.float32), 3) for v in affine)


def _check_files(config: ml_collections.ConfigDict) -> None:
  """The data directory and ``config.init_from`` (and its options) are there."""
  data_dir = config.dataset.data_dir
  if data_dir and not config.dataset.prepare and not paths.exists(data_dir):
    raise errors.MissingFileError(f'config.dataset.data_dir={data_dir} does not exist.')
  init_from = config.init_from
  if init_from:
    if not init_from.startswith('hf-hub:') and not paths.exists(init_from):  # Local or gs://.
      raise errors.MissingFileError(
          f'config.init_from={init_from} is neither a release .npz file nor another checkpoint '
          f'(it does not exist): name {formats.ACCEPTED}.')
    try:
      kind = formats.origin(init_from)
      if kind == formats.WORKDIR:
        workdir_lib.resolve_step(init_from, config.init_step)  # Raises, naming the steps.
      elif kind in (formats.HF_HUB, formats.TIMM, formats.TRANSFORMERS):  # hf-hub: fetched now.
        hub.read_weights(formats.local_folder(init_from), arrays=False)  # Damaged? As below.
      elif kind == formats.NPZ:
        release.read_npz(init_from, arrays=False)  # Damaged? Before anything is written.
      elif kind == formats.BIG_VISION:  # Every chunk there? (zarr reads a missing one as 0.)
        big_vision.params_arrays(init_from, config.init_step)
    except errors.UserError as e:
      raise type(e)(f'config.init_from: {e}') from None
  workdir_lib.check_init_from(config)  # init_ema, init_source_grid, init_source_pool.


def _scaled_pipelines(config: ml_collections.ConfigDict, with_data: bool) -> dict[str, str]:
  """``dataset.pp_train`` and ``pp_eval`` as run: scaled as ``config.init_from``'s images
  were where it records that (a timm or transformers checkpoint; read with the data) and
  ``config.init_normalization`` is on; either way a difference is one log line."""
  specs = {field: config.dataset[field] for field in ('pp_train', 'pp_eval')}
  source, taken = config.init_from, config.init_normalization
  if not (with_data and source) or formats.origin(source) not in (
      formats.TIMM, formats.TRANSFORMERS, formats.HF_HUB):
    return specs
  scaling = formats.preprocessing(formats.local_folder(source)).scaling
  scaled = {field: preprocess.rescaled(spec, scaling) for field, spec in specs.items()}
  used = scaled if taken else specs
  if scaled != specs:
    (logging.info if taken else logging.warning)(
        "Preprocessing: pp_train=%r, pp_eval=%r; %s's images were scaled by %s, %s "
        '(config.init_normalization=%s).', used['pp_train'], used['pp_eval'], source, scaling,
        'taken here' if taken else "which the config's pipelines override", taken)
  return used


def _check_batches(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> None:
  """Both batches split evenly over the devices that split them, and into micro-batches."""
  sizes.check_batches(config, math.prod(mesh.shape[a] for a in sharding.BATCH_AXES))


def _check_image_size(model: nn.Module, configured: Any) -> None:
  """Every image side a multiple of the patch (times the hybrid stem's stride)."""
  stride = model.stem_stride
  for side, patch in zip(pair(model.image_size), pair(model.patch_size), strict=True):
    unit = patch * stride
    if side % unit:
      lower = side // unit * unit
      sizes = f'{lower} or {lower + unit}' if lower else f'{unit}'
      unit_text = f'{patch} x the BiT stem\'s stride {stride} = {unit}' if stride > 1 else unit
      raise errors.ConfigError(
          f'config.model.image_size={configured or model.image_size}: {side} px is not a '
          f'multiple of the patch size ({unit_text} px), so the last {side % unit} px would be '
          f'dropped. Use {sizes}.')

