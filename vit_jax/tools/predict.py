r"""Top-5 classes of image files, from a run's workdir or any other checkpoint (a SOURCE).

    python -m vit_jax.tools.predict --workdir=/tmp/q digit.png
    python -m vit_jax.tools.predict --npz=ViT-B_16.npz --image_size=384 cat.jpg dog.jpg
    python -m vit_jax.tools.predict \
        --source=hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k cat.jpg

A workdir gives the model, its latest checkpoint (``--step``; ``--ema``: the weights' moving
average), the class names and the eval preprocessing. A .npz file's architecture is read from its
shapes (or ``--model``), its images resized to ``--image_size`` and scaled to [-1, 1] as in the
releases (or ``--pp``). ``--source`` takes any checkpoint (docs/checkpoints.md): a timm or
transformers folder or ``hf-hub:ORG/NAME`` brings its architecture and class names in its
config.json, and its preprocessing (timm's ``pretrained_cfg``, transformers'
preprocessor_config.json: resize, crop, mean and std; a SigLIP 2 NaFlex checkpoint's: each
image cut into patches at its own aspect ratio, ``naflex``). Runs on the default JAX device,
``--batch_size`` images at a time.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import io
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from vit_jax import checkpoints
from vit_jax.base import errors, paths
from vit_jax.base.sizes import pair
from vit_jax.checkpoints.run import record
from vit_jax.data import preprocess, sources

if TYPE_CHECKING:  # jax, flax and the checkpoints load after the command line is checked.
  import jax

  from vit_jax.checkpoints.formats import layout
  from vit_jax.models import VisionTransformer

NPZ_PP = 'decode|resize({size})|value_range(-1, 1)'
IMAGENET_NOTE = ('ImageNet class names are not available offline; showing the WordNet ids of '
                 "TFDS's imagenet2012 label list (class index order). Pass --class_names=FILE "
                 'for names.')


@dataclasses.dataclass(frozen=True)
class Source:
  """A model ready to predict, with what its inputs and outputs mean."""

  loaded: layout.Loaded
  pp_spec: str
  activation: str  # 'softmax' or 'sigmoid'
  class_names: tuple[str, ...]
  notes: tuple[str, ...] = ()

  @property
  def model(self) -> VisionTransformer:
    return self.loaded.model

  @property
  def params(self) -> dict[str, Any]:
    return self.loaded.params

  def label(self, index: int) -> str:
    return self.class_names[index] if self.class_names else f'class {index}'


class ImageError(ValueError):
  """An image file that cannot be read or preprocessed."""


class PipelineError(ValueError):
  """A preprocessing pipeline that does not make the model's input shape."""


def add_source_flags(parser: argparse.ArgumentParser) -> None:
  """The flags that pick a model: --workdir, --npz or --source, and their options."""
  group = parser.add_mutually_exclusive_group(required=True)
  group.add_argument('--workdir', type=paths.expand,
                     help='a vit_jax.main run directory (config.json, checkpoints/)')
  group.add_argument('--npz', type=paths.expand, help='a release or exported .npz checkpoint')
  group.add_argument('--source', type=paths.expand,
                     help='any checkpoint: a workdir, a .npz file, a timm or transformers '
                     'folder, hf-hub:ORG/NAME or a big_vision tensorstore folder')
  parser.add_argument('--step', type=int, default=None,
                      help='workdir (or big_vision): the checkpoint step (default: the latest)')
  parser.add_argument('--ema', action='store_true',
                      help="workdir: the weights' moving average (the run's "
                           'config.optimizer.ema_decay) instead of the weights')
  parser.add_argument('--allow_nonfinite', action='store_true',
                      help='workdir: use a checkpoint that holds NaN or infinity (its run '
                           'diverged), with a warning, instead of refusing it')
  parser.add_argument('--pool', default=None, choices=('gap', '0', 'none'),
                      help="npz: a big_vision file's pool type where its arrays do not tell "
                           "(gap, 0 and none store the same ones; only gap is this ViT's)")
  parser.add_argument('--model', default=None,
                      help='npz: the registry model (e.g. b16); default: read from its shapes')
  parser.add_argument('--image_size', type=int, default=None,
                      help="npz: input size in pixels (default: the file's own, 224 for "
                           'the pre-training releases)')
  parser.add_argument('--pp', default=None,
                      help='preprocessing pipeline (default: the run\'s dataset.pp_eval; the '
                           'checkpoint\'s own for timm and transformers; for npz '
                           f'"{NPZ_PP.format(size="SIZE")}")')
  parser.add_argument('--class_names', default=None, type=paths.expand,
                      help='a JSON list or a text file with one class name per line')
  parser.add_argument('--activation', choices=('auto', 'softmax', 'sigmoid'), default='auto',
                      help="probabilities (auto: sigmoid for a run trained with 'sigmoid_xent')")
  parser.add_argument('--batch_size', type=int, default=32, help='images per forward pass')


def _read_class_names(path: str) -> tuple[str, ...]:
  text = paths.read_bytes(path, '--class_names').decode()  # Local or remote (gs://).
  if text.lstrip().startswith('['):
    return tuple(str(n) for n in json.loads(text))
  return tuple(line.strip() for line in text.splitlines() if line.strip())


def imagenet_wordnet_ids() -> tuple[str, ...]:
  """The 1,000 ImageNet WordNet ids in class-index order (TFDS ships them), or ()."""
  try:
    import tensorflow_datasets as tfds

    path = tfds.core.tfds_path('datasets/imagenet2012/labels.txt')
    return tuple(line.strip() for line in path.read_text().splitlines() if line.strip())
  except Exception:  # An optional convenience: class indices then.
    return ()


def _workdir_class_names(loaded: layout.Loaded) -> tuple[str, ...]:
  """classes.json, or the class names of the run's dataset when it can be opened."""
  if loaded.class_names:
    return loaded.class_names
  try:
    dataset = loaded.config.dataset
    return tuple(sources.get_source(dataset, dataset.get('eval_split', 'test')).class_names)
  except Exception:  # The data may be elsewhere: class indices then.
    return ()


def resolve_source_flags(args: argparse.Namespace) -> None:
  """``--source`` as ``--workdir`` where it names a workdir (``args`` updated in place)."""
  if getattr(args, 'source', None) and record.is_workdir(args.source):
    args.workdir, args.source = args.source, None


def check_source_paths(args: argparse.Namespace) -> None:
  """--workdir, --npz or --source checked before the model loads (``vit_jax.base.paths``)."""
  if args.workdir:
    paths.run_dir(args.workdir)
  elif args.npz:
    paths.input_path(args.npz, 'npz', '.npz file')
  elif not args.source.startswith('hf-hub:'):
    paths.input_path(args.source, 'source', 'checkpoint')


def load_source(args: argparse.Namespace) -> Source:
  """The model, preprocessing and class names that ``--workdir`` / ``--npz`` / ``--source``
  select."""
  from vit_jax.checkpoints import formats  # It imports jax: the command line is checked before.

  notes = []
  resolve_source_flags(args)
  if args.workdir:
    if args.model or args.image_size or args.pool:
      raise ValueError('--model, --image_size and --pool are for --npz; a workdir\'s config '
                       'fixes them.')
    loaded = checkpoints.load(args.workdir, step=args.step, ema=args.ema,
                              allow_nonfinite=args.allow_nonfinite)
    pp_spec = args.pp or loaded.config.dataset.pp_eval
    loss = loaded.config.get('loss', 'softmax_xent')
    activation = 'sigmoid' if loss == 'sigmoid_xent' else 'softmax'
    names = _workdir_class_names(loaded)
    if not names:
      notes.append(f'{args.workdir} has no class names (classes.json); showing class indices.')
  else:
    source = getattr(args, 'source', None) or args.npz
    kind = formats.NPZ if args.npz else formats.origin(source)
    what = 'a .npz file' if kind == formats.NPZ else f'a {kind} checkpoint'
    if args.step is not None and kind != formats.BIG_VISION:
      raise ValueError(f'--step is for --workdir; {what} holds one set of parameters.')
    if args.ema:
      raise ValueError(f'--ema is for --workdir; {what} holds one set of parameters (export a '
                       'run\'s average with python -m vit_jax.tools.export --ema).')
    if args.npz:  # A release or big_vision .npz file, as ever.
      loaded = formats.release.load_npz_model(args.npz, args.model, args.image_size, pool=args.pool)
    else:
      loaded = formats.load(source, model_name=args.model, image_size=args.image_size,
                            pool=args.pool, step=args.step)
    pp_spec = args.pp or loaded.preprocessing.spec(pair(loaded.model.image_size))
    activation = 'softmax'
    num_classes = loaded.model.num_classes
    names = loaded.class_names
    if not num_classes:
      notes.append(f'{source} has no classifier head.')
    elif names or args.class_names:
      pass
    elif num_classes == 1000:
      names = imagenet_wordnet_ids()
      notes.append(IMAGENET_NOTE if names else
                   'No ImageNet class list is available offline (tensorflow_datasets is not '
                   'installed); showing class indices. Pass --class_names=FILE for names.')
    else:
      notes.append(f'{source} comes without class names; showing class indices '
                   '(--class_names=FILE for names).')
  if args.class_names:
    names = _read_class_names(args.class_names)
  num_classes = loaded.model.num_classes or 0
  if names and len(names) != num_classes:
    notes.append(f'{len(names)} class names for {num_classes} classes: showing indices.')
    names = ()
  if args.activation != 'auto':
    activation = args.activation
  return Source(loaded, pp_spec, activation, tuple(names), tuple(notes))


def read_image(path: str | os.PathLike) -> np.ndarray:
  """An image file (local or remote: ``vit_jax.base.paths``) as an RGB uint8 array (OpenCV, or
  Pillow for what it cannot read)."""
  try:
    data = paths.read_bytes(path, 'image')
  except errors.MissingFileError as e:
    raise ImageError(str(e)) from None
  try:
    return preprocess.decode()(data, None)
  except ValueError:
    pass
  try:
    from PIL import Image, UnidentifiedImageError

    with Image.open(io.BytesIO(data)) as image:
      return np.asarray(image.convert('RGB'))
  except (UnidentifiedImageError, OSError, ValueError) as e:
    why = (f'it starts {data[:16]!r}' if isinstance(e, UnidentifiedImageError)  # Not its repr
           else str(e))  # of a BytesIO: what the file holds.
    raise ImageError(f'cannot read image {path}: not an image file OpenCV or Pillow can '
                     f'decode ({len(data)} bytes; {why}).') from None


def load_file(path: str, prep: Callable[[Any], np.ndarray]) -> np.ndarray:
  """Reads and preprocesses one file; its problems (not the pipeline's) name the file."""
  image = read_image(path)
  try:
    return prep(image)
  except PipelineError:
    raise
  except ValueError as e:
    raise ImageError(f'cannot preprocess image {path} ({image.shape[1]}x{image.shape[0]}): '
                     f'{e}') from None


def display_spec(pp_spec: str) -> str:
  """The pipeline without its scaling ops: the model's input as uint8 pixels."""
  parts = [p for p in pp_spec.split('|') if not p.strip().startswith(('value_range', 'normalize'))]
  return '|'.join(parts) or 'to_rgb'


def preprocess_fn(source: Source, display: bool = False) -> Callable[[Any], Any]:
  """image (array or bytes) -> the model's input (or, with ``display``, its uint8 pixels): an
  image, or a NaFlex pipeline's patch sequence (a dict of ``preprocess.PATCH_KEYS``)."""
  fn = preprocess.parse(display_spec(source.pp_spec) if display else source.pp_spec)
  expected = (*pair(source.model.image_size), 3)
  ph, pw = pair(source.model.patch_size)

  def apply(image: Any) -> Any:
    out = fn(image, np.random.default_rng(0))
    if isinstance(out, dict):  # Patches of the model's size, whatever the image's.
      if out['image'].shape[-1] != ph * pw * 3:
        raise PipelineError(f'The preprocessing "{source.pp_spec}" cuts patches of '
                            f'{out["image"].shape[-1] // 3} pixels; {source.model.model_name} '
                            f'embeds {ph}x{pw} patches. Pass --pp with naflex({ph}, N).')
      return out
    if not display and tuple(out.shape) != expected:
      raise PipelineError(f'The preprocessing "{source.pp_spec}" makes {tuple(out.shape)} images; '
                       f'{source.model.model_name} expects {expected}. Pass --pp with a '
                       'matching resize/crop (or --image_size for a .npz file).')
    return out
  return apply


def _logits(model: VisionTransformer, params: Any, inputs: Any) -> jax.Array:
  return model.apply({'params': params}, inputs, train=False)


@functools.cache
def jitted(fn: Callable) -> Callable:
  """``jax.jit(fn, static_argnums=0)``, made at the first call (jax is imported then)."""
  import jax

  return jax.jit(fn, static_argnums=0)


def logits_of(model: VisionTransformer, params: Any, inputs: Any) -> jax.Array:
  """The model's logits of images or a ``naflex.PatchSequence`` (jitted; one compilation per
  model and batch shape)."""
  return jitted(_logits)(model, params, inputs)


def runnable(model: VisionTransformer) -> VisionTransformer:
  """The model, with the cuDNN attention kernel swapped for XLA's off NVIDIA GPUs."""
  import jax

  if model.attention_impl == 'cudnn' and jax.default_backend() != 'gpu':
    return model.clone(attention_impl='xla')  # The same function, without the GPU kernel.
  return model


def batches(items: Sequence, size: int) -> Iterator[Sequence]:
  for start in range(0, len(items), size):
    yield items[start:start + size]


def padded(images: list[Any], size: int) -> Any:
  """Stacks images and pads with zeros to ``size`` rows (one compiled shape); patch sequences
  key by key (a padding row: no patches), as the loader batches them."""
  if isinstance(images[0], dict):
    pad = lambda x: np.pad(x, [(0, size - len(x))] + [(0, 0)] * (x.ndim - 1))
    return {k: pad(padded([x[k] for x in images], size) if k == 'image' else
                   np.stack([x[k] for x in images])) for k in images[0]}
  stacked = np.stack(images).astype(np.float32)
  return np.pad(stacked, [(0, size - len(stacked))] + [(0, 0)] * (stacked.ndim - 1))


def predict_files(source: Source, paths: Sequence[str], batch_size: int,
                  top: int = 5) -> Iterator[tuple[str, list[tuple[str, float]] | ImageError]]:
  """For each file, its ``top`` (label, probability) pairs, or the error reading it."""
  import jax

  from vit_jax.tools import analysis  # After load_source: jax is there already.

  if not source.model.num_classes:
    raise ValueError(f'{source.loaded.source} has no classifier head: nothing to predict.')
  model = runnable(source.model)
  params = jax.device_put(source.params)
  prep = preprocess_fn(source)
  size = max(1, min(batch_size, len(paths)))
  for chunk in batches(list(paths), size):
    images, ok, results = [], [], {}
    for path in chunk:
      try:
        images.append(load_file(path, prep))
        ok.append(path)
      except ImageError as e:
        results[path] = e
    if images:
      batch = padded(images, size)
      logits = np.asarray(logits_of(model, params, analysis.model_inputs(batch)))[:len(images)]
      indices, values = analysis.top_k(analysis.probabilities(logits, source.activation), top)
      for path, idx, val in zip(ok, indices, values, strict=True):
        results[path] = [(source.label(int(i)), float(v)) for i, v in zip(idx, val, strict=True)]
    for path in chunk:
      yield path, results[path]


def describe(source: Source) -> str:
  import jax

  h, w = pair(source.model.image_size)
  inputs = (f'{h}x{w} input' if not preprocess.parse(source.pp_spec).patches else
            "patch sequences, each image at its own aspect ratio")
  return (f'{source.model.model_name} from {source.loaded.source}; {inputs} '
          f'("{source.pp_spec}"); {source.activation} probabilities; '
          f'{jax.devices()[0].platform}')


def main(argv: Sequence[str] | None = None) -> int:
  parser = errors.ArgumentParser(prog='python -m vit_jax.tools.predict', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  add_source_flags(parser)
  parser.add_argument('--top', type=int, default=5, help='classes shown per image')
  parser.add_argument('images', nargs='+', type=paths.expand, help='image files (JPEG, PNG, ...)')
  args = parser.parse_args(argv)

  try:
    check_source_paths(args)
    paths.input_files(args.images, every=False)  # Each missing one is named as it comes.
    source = load_source(args)
    print(f'# {describe(source)}')
    for note in source.notes:
      print(f'note: {note}', file=sys.stderr)
    failed = 0
    for path, result in predict_files(source, args.images, args.batch_size, args.top):
      if isinstance(result, ImageError):
        print(f'error: {result}', file=sys.stderr)
        failed += 1
        continue
      print(path)
      for rank, (label, p) in enumerate(result, 1):
        print(f'  {rank}. {100 * p:6.2f}%  {label}')
  except (errors.UserError, FileNotFoundError, ValueError) as e:
    return errors.report(e)  # One line, exit status 2, as every entry point.
  return errors.EXIT_STATUS if failed else 0  # A file that is not an image: the user's.


if __name__ == '__main__':
  sys.exit(main())
