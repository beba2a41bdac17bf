r"""Few-shot linear evaluation of frozen features, as the paper tracks pre-training.

The paper (section 4, figures 3-6) measures a representation by a regularised
least-squares regression from the frozen features of K examples per class to
{-1, 1} targets, and the accuracy of its argmax on the test split. Computed here as
big_vision's ``fewshot_lsr`` evaluator computes it, so the numbers compare with
published ones: the features standardised with the few-shot set's own mean and
standard deviation (+1e-5), a constant bias feature of 100 (large, so almost
unregularised), l2 = 2^10, shots (1, 5, 10, 25), the examples of each seed drawn as
``numpy.random.default_rng(seed)`` permutes each class's indices (the first K of each
class; the same draws as big_vision's for the same labels), and the representation
the classifier head reads: the pre-logits layer where the model has one, else the
pooled output (``VisionTransformer`` with ``num_classes=0``).

    python -m vit_jax.fewshot --workdir=/tmp/q --dataset=digits
    python -m vit_jax.fewshot --npz=ViT-B_16.npz --model=b16 --dataset=cifar100 \
        --pp='decode|resize(224)|value_range(-1, 1)'

During training, ``config.evals.fewshot`` (``vit_jax/config/__init__.py``) names the
datasets; the metrics are ``fewshot/<dataset>_<shots>shot``, the mean over the seeds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax.base import errors, paths, sharding
from vit_jax.models.vit import pair

BIAS_CONSTANT = 100.  # big_vision's constant bias feature.
STD_EPSILON = 1e-5  # Added to the few-shot set's standard deviation (big_vision's).
DEFAULT_SHOTS = (1, 5, 10, 25)
DEFAULT_L2_REG = 2.0**10


# ---------------------------------------------------------------------------
# The regression.


def linear_fewshot_accuracy(train_features: np.ndarray, train_labels: np.ndarray,
                            test_features: np.ndarray, test_labels: np.ndarray,
                            num_classes: int, l2_reg: float = DEFAULT_L2_REG) -> float:
  """Test accuracy of a ridge regression to {-1, 1} one-hot targets (big_vision's fewshot_lsr).

  ``train_features`` (N, D) and integer ``train_labels`` (N,) are the few-shot set;
  both feature sets are standardised with its mean and std (+1e-5), a constant feature
  of 100 is appended for the bias, and W = argmin |X W - Y|^2 + l2_reg |W|^2 is solved in
  float64 (on the N x N system when D > N, as big_vision does). Ties in the argmax go
  to the lowest class index.
  """
  x, y = np.asarray(train_features), np.asarray(train_labels)
  x_test, y_test = np.asarray(test_features), np.asarray(test_labels)
  if x.ndim != 2 or x_test.ndim != 2 or x.shape[1] != x_test.shape[1]:
    raise ValueError(f'features must be (examples, dims) with the same dims; got train '
                     f'{x.shape} and test {x_test.shape}.')
  if y.shape != (len(x),) or y_test.shape != (len(x_test),):
    raise ValueError(f'labels must be one integer per example: train {y.shape} for '
                     f'{len(x)} examples, test {y_test.shape} for {len(x_test)}.')
  if not len(x) or not len(x_test):
    raise ValueError('the few-shot set and the test set must not be empty.')
  for name, labels in (('train', y), ('test', y_test)):
    if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0 or \
        labels.max() >= num_classes:
      raise ValueError(f'{name} labels must be integers in [0, {num_classes}); got '
                       f'{labels.dtype} in [{labels.min()}, {labels.max()}].')
  if not l2_reg > 0:
    raise ValueError(f'l2_reg={l2_reg} must be positive.')
  x, x_test = x.astype(np.float64), x_test.astype(np.float64)
  mean, std = x.mean(0, keepdims=True), x.std(0, keepdims=True) + STD_EPSILON

  def standardise(f: np.ndarray) -> np.ndarray:
    f = (f - mean) / std
    return np.concatenate([f, np.full((len(f), 1), BIAS_CONSTANT)], axis=1)

  x, x_test = standardise(x), standardise(x_test)
  targets = 2. * np.eye(num_classes)[y] - 1.
  n, d = x.shape
  if n >= d:  # (X'X + l2 I)^-1 X'Y
    w = np.linalg.solve(x.T @ x + l2_reg * np.eye(d), x.T @ targets)
  else:  # X' (XX' + l2 I)^-1 Y: the same W, through the smaller system.
    w = x.T @ np.linalg.solve(x @ x.T + l2_reg * np.eye(n), targets)
  return float(np.mean(np.argmax(x_test @ w, axis=1) == y_test))


def fewshot_indices(labels: np.ndarray, num_classes: int, shots: int, seed: int) -> np.ndarray:
  """The few-shot set of ``seed``: the first ``shots`` of each class's permuted indices.

  The permutations are drawn class by class from one ``numpy.random.default_rng(seed)``,
  as big_vision draws them, so a seed's 1-shot set is inside its 5-shot set. A class
  with fewer than ``shots`` examples is refused (big_vision would silently use fewer).
  """
  rng = np.random.default_rng(seed)
  picked = []
  for c in range(num_classes):
    members = rng.permutation(np.flatnonzero(labels == c))
    if len(members) < shots:
      raise errors.DataError(f'class {c} has {len(members)} examples, fewer than {shots} '
                             'shots: lower the shots or use a larger few-shot split.')
    picked.append(members[:shots])
  return np.concatenate(picked)


def accuracies(train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
               num_classes: int, shots: Sequence[int], seeds: int,
               l2_reg: float = DEFAULT_L2_REG) -> dict[int, list[float]]:
  """{shots: [accuracy of seed 0, 1, ...]} from the features and labels of two splits."""
  (x, y), (x_test, y_test) = train, test
  out: dict[int, list[float]] = {k: [] for k in shots}
  for seed in range(seeds):
    for k in shots:
      index = fewshot_indices(y, num_classes, k, seed)
      out[k].append(linear_fewshot_accuracy(x[index], y[index], x_test, y_test, num_classes,
                                            l2_reg))
  return out


# ---------------------------------------------------------------------------
# Features: one pass over a split, sharded like the eval step.


def feature_model(model: nn.Module) -> nn.Module:
  """The model without its classifier: the pre-logits output, or the pooled one."""
  return model.clone(num_classes=0)


def make_feature_step(model: nn.Module, param_shardings: Any,
                      batch_sharding: jax.sharding.NamedSharding) -> Callable:
  """A jitted (params, batch) -> (features, labels, mask), gathered onto every process."""
  features_of = feature_model(model)
  replicated = sharding.replicated(batch_sharding.mesh)

  def step(params: Any, batch: dict[str, jax.Array]) -> tuple[jax.Array, ...]:
    with jax.sharding.use_abstract_mesh(batch_sharding.mesh.abstract_mesh):
      features = features_of.apply({'params': params}, batch['image'], train=False)
    return features, jnp.argmax(batch['label'], -1), batch['mask']

  return jax.jit(step, in_shardings=(param_shardings, batch_sharding),
                 out_shardings=replicated)


def split_features(feature_step: Callable, params: Any, source: Any, pp: Callable, *,
                   batch_size: int, batch_sharding: Any, num_classes: int,
                   num_workers: int = 4) -> tuple[np.ndarray, np.ndarray]:
  """(features (N, D) float32, labels (N,) int) of every example of ``source``, in order."""
  from vit_jax.data import loader

  features, labels = [], []
  for batch in loader.eval_batches(source, pp, global_batch_size=batch_size,
                                   sharding=batch_sharding, num_classes=num_classes,
                                   num_workers=num_workers):
    f, y, mask = jax.device_get(feature_step(*sharding.inputs_ready((params, batch))))
    keep = np.asarray(mask) > 0
    features.append(np.asarray(f, np.float32)[keep])
    labels.append(np.asarray(y)[keep])
  return np.concatenate(features), np.concatenate(labels).astype(np.int64)


# ---------------------------------------------------------------------------
# Datasets named in a config or on the command line.


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A few-shot dataset: its name in the metrics, its two splits' sources."""

  name: str
  train: Any
  test: Any
  num_classes: int


def parse_spec(spec: str) -> tuple[str, str, str, str]:
  """``'NAME[,TRAIN_SPLIT,TEST_SPLIT[,DATA_DIR]]'`` -> (name, train, test, data_dir)."""
  parts = [p.strip() for p in str(spec).split(',')]
  if len(parts) not in (1, 3, 4) or not all(parts):
    raise errors.ConfigError(
        f'few-shot dataset {spec!r}: write NAME, or NAME,TRAIN_SPLIT,TEST_SPLIT, or '
        'NAME,TRAIN_SPLIT,TEST_SPLIT,DATA_DIR (e.g. "digits" or '
        '"cifar100,train[:10000],test").')
  if len(parts) == 1:
    parts += ['train', 'test']
  if len(parts) == 3:
    parts.append('')
  return tuple(parts)


def metric_name(name: str) -> str:
  """A TFDS name without its version (``cars196:2.1.0`` -> ``cars196``)."""
  return name.split(':')[0]


def open_dataset(spec: str, default_data_dir: str = '') -> Dataset:
  """The sources of a spec (``parse_spec``); raises UserErrors naming the spec."""
  from vit_jax.data import sources

  name, train_split, test_split, data_dir = parse_spec(spec)
  dataset = ml_collections.ConfigDict(dict(name=name, data_dir=data_dir or default_data_dir,
                                           manual_dir='', prepare=False))
  try:
    train = sources.get_source(dataset, train_split)
    test = sources.get_source(dataset, test_split)
  except FileNotFoundError as e:
    raise errors.MissingFileError(f'few-shot dataset {spec!r}: {e}') from None
  except ValueError as e:
    raise errors.ConfigError(f'few-shot dataset {spec!r}: {e}') from None
  if getattr(train, 'multi_label', False) or getattr(test, 'multi_label', False):
    raise errors.ConfigError(f'few-shot dataset {spec!r} is multi-label; the few-shot '
                             'regression needs one class per example.')
  if train.num_classes != test.num_classes:
    raise errors.ConfigError(f'few-shot dataset {spec!r}: {train_split!r} has '
                             f'{train.num_classes} classes, {test_split!r} {test.num_classes}.')
  return Dataset(metric_name(name), train, test, int(train.num_classes))


def check_shots(dataset: Dataset, shots: Sequence[int]) -> None:
  """Every class has ``max(shots)`` training examples, where the labels are in memory."""
  labels = getattr(dataset.train, 'labels', None)
  if labels is None or np.ndim(labels) != 1:
    return  # Checked when the features are computed.
  counts = np.bincount(np.asarray(labels), minlength=dataset.num_classes)
  if counts.min() < max(shots):
    raise errors.ConfigError(
        f'few-shot dataset {dataset.name!r}: class {int(counts.argmin())} has '
        f'{int(counts.min())} training examples, fewer than {max(shots)} shots.')


def check_pipeline(pp: Callable, dataset: Dataset, image_size: Any, where: str) -> None:
  """``pp`` makes the model's input from the first example of each split."""
  expected = (*pair(image_size), 3)
  for split in (dataset.train, dataset.test):
    try:
      shape = tuple(pp(split[0]['image'], np.random.default_rng(0)).shape)
    except Exception as e:  # Any failure of the user's pipeline on the user's data.
      raise errors.ConfigError(f'{where}={pp.spec!r} fails on the first example of few-shot '
                               f'dataset {dataset.name!r}: {type(e).__name__}: {e}') from None
    if shape != expected:
      raise errors.ConfigError(
          f'{where}={pp.spec!r} makes {"x".join(map(str, shape))} images from few-shot dataset '
          f'{dataset.name!r}, but the model takes {"x".join(map(str, expected))}: resize or '
          'crop to the model\'s input size.')


def check_options(shots: Sequence[int], seeds: int, l2_reg: float, where: str) -> None:
  if not shots or not all(isinstance(k, int) and not isinstance(k, bool) and k > 0
                          for k in shots):
    raise errors.ConfigError(f'{where}shots={tuple(shots)!r} must be positive ints, e.g. '
                             f'{DEFAULT_SHOTS}.')
  if not (isinstance(seeds, int) and seeds > 0):
    raise errors.ConfigError(f'{where}seeds={seeds!r} must be a positive int (e.g. 3).')
  if not (isinstance(l2_reg, (int, float)) and l2_reg > 0):
    raise errors.ConfigError(f'{where}l2_reg={l2_reg!r} must be positive (2.0**10).')


# ---------------------------------------------------------------------------
# The evaluator of a training run.


@dataclasses.dataclass
class Evaluator:
  """Few-shot accuracy of a run's parameters on its configured datasets.

  ``run`` computes the features of each split once (every example, sharded like the
  eval step), then every seed and shot count from them on the host.
  """

  datasets: list[Dataset]
  pp: Callable
  shots: tuple[int, ...]
  seeds: int
  l2_reg: float
  every_steps: int
  batch_size: int
  num_workers: int = 4
  feature_step: Callable | None = None
  batch_sharding: Any = None

  def due(self, step: int, total_steps: int, eval_every_steps: int = 0) -> bool:
    """At every ``every_steps`` (0: with each evaluation) and at the last step."""
    every = self.every_steps or eval_every_steps
    return step == total_steps or bool(every and step % every == 0)

  def bind(self, model: nn.Module, param_shardings: Any, batch_sharding: Any) -> Evaluator:
    """Ready to run on a mesh: the feature step for ``model``'s parameters."""
    self.feature_step = make_feature_step(model, param_shardings, batch_sharding)
    self.batch_sharding = batch_sharding
    return self

  def accuracies(self, params: Any) -> dict[tuple[str, int], list[float]]:
    """{(dataset, shots): [accuracy per seed]}."""
    out = {}
    for dataset in self.datasets:
      train, test = (split_features(self.feature_step, params, source, self.pp,
                                    batch_size=self.batch_size,
                                    batch_sharding=self.batch_sharding,
                                    num_classes=dataset.num_classes,
                                    num_workers=self.num_workers)
                     for source in (dataset.train, dataset.test))
      try:
        per_shots = accuracies(train, test, dataset.num_classes, self.shots, self.seeds,
                               self.l2_reg)
      except errors.DataError as e:
        raise errors.DataError(f'few-shot dataset {dataset.name!r}: {e}') from None
      out.update({(dataset.name, k): v for k, v in per_shots.items()})
    return out

  def run(self, params: Any) -> dict[str, float]:
    """``{'fewshot/<dataset>_<shots>shot': mean accuracy over the seeds}``."""
    return {f'fewshot/{name}_{k}shot': float(np.mean(v))
            for (name, k), v in self.accuracies(params).items()}


def from_config(config: ml_collections.ConfigDict, image_size: Any) -> Evaluator | None:
  """The evaluator ``config.evals.fewshot`` asks for (None: no datasets), checked.

  Raises UserErrors before anything compiles: a bad spec, a dataset that is not there,
  a pipeline that does not make the model's input, too few examples for the shots.
  """
  from vit_jax.data import preprocess

  fs = config.evals.fewshot
  if not fs.datasets:
    return None
  where = 'config.evals.fewshot.'
  if isinstance(fs.datasets, str):
    raise errors.ConfigError(f'{where}datasets={fs.datasets!r} must be a tuple of names, '
                             f'e.g. ("{fs.datasets}",).')
  shots = tuple(fs.shots)
  check_options(shots, fs.seeds, fs.l2_reg, where)
  if not (isinstance(fs.every_steps, int) and fs.every_steps >= 0):
    raise errors.ConfigError(f'{where}every_steps={fs.every_steps!r} must be an int >= 0 '
                             '(0: with each evaluation).')
  spec = fs.pp or config.dataset.pp_eval
  try:
    pp = preprocess.parse(spec)
  except ValueError as e:
    raise errors.ConfigError(f'{where}pp: {e}') from None
  datasets = [open_dataset(s, config.dataset.data_dir
                          if parse_spec(s)[0] == config.dataset.name else '')
              for s in fs.datasets]
  names = [d.name for d in datasets]
  if len(set(names)) < len(names):
    raise errors.ConfigError(f'{where}datasets={tuple(fs.datasets)!r} names a dataset twice.')
  for dataset in datasets:
    check_pipeline(pp, dataset, image_size, f'{where}pp' if fs.pp else 'config.dataset.pp_eval')
    check_shots(dataset, shots)
  return Evaluator(datasets, pp, shots, int(fs.seeds), float(fs.l2_reg), int(fs.every_steps),
                   int(config.eval_batch_size or config.batch_size),
                   num_workers=int(config.input_workers))


# ---------------------------------------------------------------------------
# The command line.


def table(results: dict[tuple[str, int], list[float]]) -> str:
  """A Markdown table: one row per dataset, one column per shot count, mean ± std (%)."""
  names = list(dict.fromkeys(name for name, _ in results))
  shots = sorted({k for _, k in results})
  lines = ['| dataset | ' + ' | '.join(f'{k}-shot' for k in shots) + ' |',
           '| --- |' + ' --- |' * len(shots)]
  for name in names:
    cells = []
    for k in shots:
      v = np.asarray(results.get((name, k), []), np.float64) * 100
      cells.append(f'{v.mean():.2f} ± {v.std():.2f}' if len(v) else '')
    lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = errors.ArgumentParser(prog='python -m vit_jax.fewshot', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  group = parser.add_mutually_exclusive_group(required=True)
  group.add_argument('--workdir', help='a vit_jax.main run directory')
  group.add_argument('--npz', help='a release or exported .npz checkpoint')
  parser.add_argument('--step', type=int, default=None, help='workdir: the checkpoint step')
  parser.add_argument('--model', default=None, help='npz: the registry model (e.g. b16)')
  parser.add_argument('--image_size', type=int, default=None, help='npz: input size in pixels')
  parser.add_argument('--dataset', action='append', required=True,
                      help='NAME or NAME,TRAIN_SPLIT,TEST_SPLIT[,DATA_DIR]; repeat for more')
  parser.add_argument('--data_dir', default='', help='data_dir of datasets that name none')
  parser.add_argument('--pp', default=None,
                      help="preprocessing (default: the run's dataset.pp_eval; for npz "
                           '"decode|resize(SIZE)|value_range(-1, 1)")')
  parser.add_argument('--shots', default=','.join(map(str, DEFAULT_SHOTS)),
                      help='comma-separated shot counts')
  parser.add_argument('--seeds', type=int, default=3, help='draws of the few-shot sets')
  parser.add_argument('--l2_reg', type=float, default=DEFAULT_L2_REG)
  parser.add_argument('--batch_size', type=int, default=256,
                      help='images per forward pass (a multiple of the devices)')
  parser.add_argument('--json', default=None, help='also write the per-seed results here')
  return parser.parse_args(argv)


def _load(args: argparse.Namespace) -> tuple[Any, Any, str]:
  """(model, params, default pipeline) of --workdir or --npz."""
  from vit_jax.checkpoints import workdir

  if args.workdir:
    if args.model or args.image_size:
      raise errors.ConfigError('--model and --image_size are for --npz; a workdir\'s config '
                               'fixes them.')
    if not workdir.is_workdir(args.workdir):
      raise errors.MissingFileError(f'--workdir={args.workdir} is not the workdir of a run '
                                    '(no checkpoints/ in it).')
    loaded = workdir.load_run(args.workdir, args.step)
    return loaded.model, loaded.params, loaded.config.dataset.pp_eval
  if args.step is not None:
    raise errors.ConfigError('--step is for --workdir; a .npz file holds one set of parameters.')
  from vit_jax.checkpoints import release

  loaded = release.load_npz_model(args.npz, args.model, args.image_size)
  h, w = pair(loaded.model.image_size)
  return loaded.model, loaded.params, f'decode|resize({h if h == w else (h, w)})|' \
      'value_range(-1, 1)'


def main(argv: Sequence[str] | None = None) -> int:
  """Prints the few-shot table of a run or a .npz file; user errors as one line, exit 2."""
  args = _parse_args(argv)
  try:
    return _main(args)
  except errors.UserError as e:
    print(f'error: {" ".join(str(e).split())}', file=sys.stderr, flush=True)
    return errors.EXIT_STATUS


def _main(args: argparse.Namespace) -> int:
  from vit_jax.data import preprocess

  try:
    shots = tuple(int(k) for k in args.shots.split(','))
  except ValueError:
    raise errors.ConfigError(f'--shots={args.shots!r} must be comma-separated ints, '
                             'e.g. 1,5,10,25.') from None
  check_options(shots, args.seeds, args.l2_reg, '--')
  if args.npz and not paths.is_file(args.npz):  # Local or remote (gs://).
    raise errors.MissingFileError(f'--npz={args.npz}: no such file.')
  if args.workdir:
    paths.run_dir(args.workdir)
  datasets = [open_dataset(spec, args.data_dir) for spec in args.dataset]
  for dataset in datasets:
    check_shots(dataset, shots)
  model, params, default_pp = _load(args)
  try:
    pp = preprocess.parse(args.pp or default_pp)
  except ValueError as e:
    raise errors.ConfigError(f'--pp: {e}') from None
  for dataset in datasets:
    check_pipeline(pp, dataset, model.image_size, '--pp')
  mesh = sharding.make_mesh()
  devices = math.prod(mesh.shape[a] for a in sharding.BATCH_AXES)
  if args.batch_size % devices:
    raise errors.ConfigError(f'--batch_size={args.batch_size} is not a multiple of the '
                             f'{devices} devices.')
  batch_sharding = sharding.batch_sharding(mesh)
  replicated = sharding.replicated(mesh)
  params = jax.device_put(params, replicated)
  evaluator = Evaluator(datasets, pp, shots, args.seeds, args.l2_reg, 0, args.batch_size)
  evaluator.bind(model, replicated, batch_sharding)
  results = evaluator.accuracies(params)
  dims = int(np.prod(jax.eval_shape(
      lambda p: feature_model(model).apply(
          {'params': p}, jnp.zeros((1, *pair(model.image_size), 3)), train=False),
      params).shape[1:]))
  print(f'# {model.model_name}: {dims}-d features, l2 {args.l2_reg:g}, {args.seeds} seeds; '
        'accuracy % (mean ± std over the seeds)')
  print(table(results))
  if args.json:
    with open(args.json, 'w') as f:
      json.dump([{'dataset': n, 'shots': k, 'accuracies': v, 'mean': float(np.mean(v))}
                 for (n, k), v in results.items()], f, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
