"""Few-shot linear accuracy of frozen features, as the paper tracks pre-training.

A regularised least-squares regression from the frozen features of K examples per class to
{-1, 1} targets, scored by its argmax on the test split (section 4, figures 3-6), computed as
big_vision's ``fewshot_lsr`` computes it so the numbers compare: features standardised with
the few-shot set's mean and std (+1e-5), a constant bias feature of 100, l2 = 2^10, shots
(1, 5, 10, 25), each seed's examples drawn as big_vision draws them. A shot count that a
class cannot supply is skipped for that dataset with one warning (big_vision would silently
draw fewer); the others are computed. The representation is what the head reads: the
pre-logits layer where there is one, else the pooled output (also of a self-supervised
encoder, whose prediction head is left out).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from vit_jax.base import errors, sharding
from vit_jax.data import loader, sources
from vit_jax.evals import base
from vit_jax.models import naflex

BIAS_CONSTANT = 100.  # big_vision's constant bias feature.
STD_EPSILON = 1e-5  # Added to the few-shot set's standard deviation (big_vision's).
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


def shot_counts(labels: np.ndarray, num_classes: int, shots: Sequence[int]
                ) -> tuple[tuple[int, ...], tuple[int, int] | None]:
  """(the shot counts every class can supply, (the smallest class, its examples) where some
  count is more than it has, else None)."""
  counts = np.bincount(np.asarray(labels, np.int64), minlength=num_classes)[:num_classes]
  smallest = int(np.argmin(counts))
  keep = tuple(k for k in shots if k <= counts[smallest])
  return keep, None if len(keep) == len(shots) else (smallest, int(counts[smallest]))


def skipped_warning(name: str, shots: Sequence[int], keep: Sequence[int],
                    short: tuple[int, int]) -> str:
  """The one line that says which shot counts of dataset ``name`` are skipped, and why."""
  skipped = ', '.join(f'{k}-shot' for k in shots if k not in keep)
  kept = ', '.join(f'{k}-shot' for k in keep) or 'no shot count'
  return (f'few-shot dataset {name!r}: class {short[0]} has {short[1]} training examples, '
          f'too few for {skipped}: skipped ({kept} computed).')


def accuracies(train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
               num_classes: int, shots: Sequence[int], seeds: int,
               l2_reg: float = DEFAULT_L2_REG) -> dict[int, list[float]]:
  """{shots: [accuracy of seed 0, 1, ...]} from the features and labels of two splits, for
  the shot counts every class can supply (``shot_counts``; the others are left out)."""
  (x, y), (x_test, y_test) = train, test
  shots, _ = shot_counts(y, num_classes, shots)
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
  """The model without its classifier (or its masked-patch-prediction head): the pre-logits
  output, or the pooled one."""
  return model.clone(num_classes=0, mpp_outputs=0)


def make_feature_step(model: nn.Module, batch_sharding: jax.sharding.NamedSharding) -> Callable:
  """A jitted (params, batch) -> (features, labels, mask), gathered onto every process."""
  features_of = feature_model(model)
  replicated = sharding.replicated(batch_sharding.mesh)

  def step(params: Any, batch: dict[str, jax.Array]) -> tuple[jax.Array, ...]:
    with jax.sharding.use_abstract_mesh(batch_sharding.mesh.abstract_mesh):
      features = features_of.apply({'params': params}, naflex.inputs(batch),
                                  train=False)
    return features, jnp.argmax(batch['label'], -1), batch['mask']

  return jax.jit(step, out_shardings=replicated)


def split_features(feature_step: Callable, params: Any, source: Any, pp: Callable, *,
                   batch_size: int, batch_sharding: Any, num_classes: int,
                   num_workers: int = 4) -> tuple[np.ndarray, np.ndarray]:
  """(features (N, D) float32, labels (N,) int) of every example of ``source``, in order."""
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


def metric_name(name: str) -> str:
  """A TFDS name without its version (``cars196:2.1.0`` -> ``cars196``)."""
  return name.split(':')[0]


def open_dataset(spec: str, default_data_dir: str = '') -> Dataset:
  """The sources of a spec (``sources.parse_fewshot_spec``); raises UserErrors naming the spec."""
  name, train_split, test_split, data_dir = sources.parse_fewshot_spec(spec)
  train, test = (base.open_source(f'few-shot dataset {spec!r}', name, split,
                                  data_dir or default_data_dir or None)
                 for split in (train_split, test_split))
  if getattr(train, 'multi_label', False) or getattr(test, 'multi_label', False):
    raise errors.ConfigError(f'few-shot dataset {spec!r} is multi-label; the few-shot '
                             'regression needs one class per example.')
  if train.num_classes != test.num_classes:
    raise errors.ConfigError(f'few-shot dataset {spec!r}: {train_split!r} has '
                             f'{train.num_classes} classes, {test_split!r} {test.num_classes}.')
  return Dataset(metric_name(name), train, test, int(train.num_classes))


def check_shots(dataset: Dataset, shots: Sequence[int]) -> tuple[int, ...] | None:
  """The shot counts every class of ``dataset`` can supply, where its labels are in memory
  (None: known once the features are computed); the others are warned about, once."""
  labels = getattr(dataset.train, 'labels', None)
  if labels is None or np.ndim(labels) != 1:
    return None
  keep, short = shot_counts(labels, dataset.num_classes, shots)
  if short:
    logging.warning(skipped_warning(dataset.name, shots, keep, short))
  return keep


def check_computable(kept: Sequence[tuple[int, ...] | None], datasets: Sequence[Dataset],
                     shots: Sequence[int], where: str) -> None:
  """Refuses a set-up where no dataset can compute any shot count (nothing to evaluate)."""
  if kept and all(k == () for k in kept):
    names = ', '.join(repr(d.name) for d in datasets)
    raise errors.ConfigError(f'{where}shots={tuple(shots)!r}: no class of few-shot dataset '
                             f'{names} has that many training examples; lower the shots.')


# ---------------------------------------------------------------------------
# The evaluator.


class Evaluator(base.Evaluator):
  """Few-shot accuracy of a model's features on its datasets, every shot count and seed.

  ``run`` computes the features of each split once (every example, sharded over the
  devices), then every seed and shot count from them on the host.
  """

  def __init__(self, name: str, every_steps: int, model: nn.Module, mesh: jax.sharding.Mesh,
               datasets: list[Dataset], pp: Callable, shots: tuple[int, ...], seeds: int,
               l2_reg: float, batch_size: int, num_workers: int = 4):
    super().__init__(name, every_steps)
    self.datasets, self.pp, self.shots, self.seeds, self.l2_reg = (
        datasets, pp, shots, seeds, l2_reg)
    self.batch_size, self.num_workers = batch_size, num_workers
    self.batch_sharding = sharding.batch_sharding(mesh)
    self.feature_step = make_feature_step(model, self.batch_sharding)
    self.warned: set[str] = set()  # Datasets whose skipped shot counts were warned about.
    self.per_seed, self.width = {}, 0  # The last run's accuracies by (dataset, shots), features.
    self.metric = f'{datasets[0].name}_{max(shots)}shot'

  def known_shots(self, kept: Sequence[tuple[int, ...] | None]) -> None:
    """The shot counts found computable when the evaluator was built (``check_shots``): the
    headline metric is the largest of the first dataset that has one."""
    for dataset, keep in zip(self.datasets, kept, strict=True):
      if keep is not None and keep != tuple(self.shots):
        self.warned.add(dataset.name)
    for dataset, keep in zip(self.datasets, kept, strict=True):
      if keep is None or keep:
        self.metric = f'{dataset.name}_{max(keep or self.shots)}shot'
        break

  @classmethod
  def headline(cls, entry: ml_collections.ConfigDict, config: ml_collections.ConfigDict) -> str:
    return f'{metric_name(sources.parse_fewshot_spec(entry.datasets[0])[0])}_{max(entry.shots)}shot'

  @classmethod
  def from_config(cls, name: str, entry: ml_collections.ConfigDict, ctx: base.Context) -> Evaluator:
    config = ctx.config  # Its entry's types and ranges are checked: vit_jax.config.
    shots = tuple(entry.shots)
    datasets = [open_dataset(s, ctx.data_dir or (
        config.dataset.data_dir if sources.parse_fewshot_spec(s)[0] == config.dataset.name else ''))
                for s in entry.datasets]
    names = [d.name for d in datasets]
    if len(set(names)) < len(names):
      raise errors.ConfigError(f'{base.where(name, "datasets")}={tuple(entry.datasets)!r} '
                               'names a dataset twice.')
    for dataset in datasets:  # The pipeline makes the model's input from each split.
      for split in (dataset.train, dataset.test):
        pp = base.pipeline(name, entry, ctx, split,
                           f'the first example of few-shot dataset {dataset.name!r}')
    kept = [check_shots(dataset, shots) for dataset in datasets]
    check_computable(kept, datasets, shots, base.where(name) + '.')
    evaluator = cls(name, entry.every_steps, ctx.model, ctx.mesh, datasets, pp, shots,
                    int(entry.seeds), float(entry.l2_reg), int(config.eval_batch_size),
                    num_workers=int(config.input_workers))
    evaluator.known_shots(kept)
    return evaluator

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
      self.width = int(train[0].shape[1])
      keep, short = shot_counts(train[1], dataset.num_classes, self.shots)
      if short and dataset.name not in self.warned:
        logging.warning(skipped_warning(dataset.name, self.shots, keep, short))
        self.warned.add(dataset.name)
      per_shots = accuracies(train, test, dataset.num_classes, keep, self.seeds, self.l2_reg)
      out.update({(dataset.name, k): v for k, v in per_shots.items()})
    return out

  def run(self, params: Any) -> dict[str, float]:
    """``{'<dataset>_<shots>shot': mean accuracy over the seeds}`` (the computable ones)."""
    self.per_seed = self.accuracies(params)
    metrics = {f'{name}_{k}shot': float(np.mean(v)) for (name, k), v in self.per_seed.items()}
    if metrics and self.metric not in metrics:  # Its shot count was found to be skipped.
      first = [k for k in metrics if k.startswith(f'{self.datasets[0].name}_')]
      self.metric = (first or list(metrics))[-1]
    return metrics


# ---------------------------------------------------------------------------
# The table of the command line (vit_jax.fewshot).


def table(results: dict[tuple[str, int], list[float]], shots: Sequence[int] = ()) -> str:
  """A Markdown table: one row per dataset, one column per shot count, mean ± sample std
  over the seeds (%), as ``vit_jax.sweep``'s tables; '-' where a class had too few examples
  (``shots``: the counts asked for, each a column even where no dataset could supply it)."""
  names = list(dict.fromkeys(name for name, _ in results))
  shots = sorted({k for _, k in results} | set(shots))
  lines = ['| dataset | ' + ' | '.join(f'{k}-shot' for k in shots) + ' |',
           '| --- |' + ' --- |' * len(shots)]
  for name in names:
    cells = []
    for k in shots:
      v = np.asarray(results.get((name, k), []), np.float64) * 100
      std = v.std(ddof=1) if len(v) > 1 else 0.
      cells.append(f'{v.mean():.2f} ± {std:.2f}' if len(v) else '-')
    lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)
