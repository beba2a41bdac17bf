"""The Hugging Face Hub's checkpoint folders: their files, ``hf-hub:`` ids, and the name tables.

timm and transformers both write a folder of ``config.json`` and ``model.safetensors`` (timm's
``save_for_hf`` / ``push_to_hf_hub``, transformers' ``save_pretrained``); ``hf-hub:ORG/NAME`` is
such a folder on the Hub, fetched into (or found in, with ``HF_HUB_OFFLINE=1``) the
``huggingface_hub`` cache (``vit_jax.checkpoints.hf_hub``). The tensors are read with the
``safetensors`` package, without torch.

Each library's module (``timm``, ``transformers``) names its tensors in ONE table of rules
``(release key, library key, layout)``, read one way to load and the other to export
(``read_table``, ``write_table``); ``layout`` says how torch stores the array (a Linear's
(out, in) weight, a Conv2d's (out, in, h, w) kernel, attention's heads flattened).
"""

from __future__ import annotations

import collections
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from vit_jax.base import errors, paths
from vit_jax.checkpoints import headers
from vit_jax.checkpoints.formats.layout import POSEMB_KEY
from vit_jax.checkpoints.hf_hub import CONFIG, WEIGHTS, WEIGHTS_INDEX
from vit_jax.models import VisionTransformer

TIMM = 'timm'
TRANSFORMERS = 'transformers'
PICKLES = ('pytorch_model.bin', 'open_clip_pytorch_model.bin')


def _safetensors_dtypes() -> dict[str, Any]:
  import ml_dtypes

  return {'F64': np.float64, 'F32': np.float32, 'F16': np.float16, 'BF16': ml_dtypes.bfloat16,
          'I64': np.int64, 'I32': np.int32, 'I16': np.int16, 'I8': np.int8, 'U8': np.uint8,
          'BOOL': np.bool_}  # Integers (a BatchNorm's count): see ``check_tensors``.


# The one integer tensor a torch vision model keeps (a BatchNorm's count of batches): no
# floating-point array of a model is read from it.
_COUNTS = 'num_batches_tracked'


# ---------------------------------------------------------------------------
# Files.


def read_json(path: str | os.PathLike) -> dict[str, Any]:
  """A JSON file (local or remote); a ``CheckpointError`` where it is not a JSON object."""
  text = paths.read_bytes(path, 'JSON file')
  try:
    value = json.loads(text)
  except ValueError as e:
    raise errors.CheckpointError(f'{path} is not a JSON file ({e}).') from None
  if not isinstance(value, dict):
    raise errors.CheckpointError(f'{path} holds a JSON {type(value).__name__}, not an object.')
  return value


def folder_format(folder: str | os.PathLike) -> str | None:
  """``TIMM`` or ``TRANSFORMERS`` for a folder whose config.json says which, None for a folder
  without config.json or whose config.json is neither (a vit_jax run's)."""
  path = paths.path(folder) / CONFIG
  if not paths.is_file(path):
    return None
  config = read_json(path)
  timm, transformers = 'architecture' in config, ('model_type' in config
                                                 or 'architectures' in config)
  if timm and transformers:
    raise errors.CheckpointError(
        f'{path} has both timm\'s "architecture" and transformers\' "model_type"/'
        '"architectures": remove the one that is not its library\'s.')
  return TIMM if timm else TRANSFORMERS if transformers else None


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """The tensors of a .safetensors file (local or remote) as numpy arrays."""
  import safetensors

  data = paths.read_bytes(path, 'safetensors file')
  try:
    tensors = safetensors.deserialize(data)
  except Exception as e:  # safetensors' SafetensorError: not a file it can read.
    raise errors.CheckpointError(f'{path} is not a safetensors file ({e}).') from None
  dtypes = _safetensors_dtypes()
  out = {}
  for name, t in tensors:
    if t['dtype'] not in dtypes:
      raise errors.CheckpointError(f'{path}: {name} is of dtype {t["dtype"]}, not one of '
                                   f'{", ".join(dtypes)}.')
    out[name] = np.frombuffer(t['data'], dtypes[t['dtype']]).reshape(t['shape'])
  return out


def check_tensors(tensors: Mapping[str, np.ndarray], origin: str) -> None:
  """Refuses, by the file's own tensor name, a tensor that cannot be the floating-point array
  the model holds: an integer or boolean one (its values truncated: 0.96 read as 0), other than
  a BatchNorm's count, or one that holds NaN or Inf."""
  for name, value in tensors.items():
    floating = value.dtype.kind == 'f' or value.dtype.name == 'bfloat16'
    if not floating and name.rsplit('.', 1)[-1] != _COUNTS:
      raise errors.CheckpointError(
          f'{origin}: {name} is {value.dtype.name}, but the model holds it as floating point '
          '(its values would be truncated): save the weights again as float32, float16 or '
          'bfloat16.')
    if floating and not np.isfinite(np.asarray(value, np.float32)).all():
      raise errors.NonFiniteCheckpointError(
          f'{origin}: {name} holds NaN or Inf: these are not weights a model can use. Take an '
          'earlier checkpoint of the run it comes from.')


def read_weights(folder: str | os.PathLike,
                 arrays: bool = True) -> dict[str, np.ndarray] | None:
  """The tensors of a folder's model.safetensors (or its shards, by the index). ``arrays=False``:
  only each file's header and size are read, for a damaged or partial file's error before a run
  writes anything: None."""
  root = paths.path(folder)
  read = read_safetensors if arrays else headers.check_safetensors
  if paths.is_file(root / WEIGHTS):
    return read(root / WEIGHTS)
  if paths.is_file(root / WEIGHTS_INDEX):
    files = sorted(set(read_json(root / WEIGHTS_INDEX).get('weight_map', {}).values()))
    missing = [name for name in files if not paths.is_file(root / name)]
    if missing:
      raise errors.MissingFileError(
          f'{root / WEIGHTS_INDEX} names {len(files)} weight files, and {", ".join(missing)} '
          f'{"is" if len(missing) == 1 else "are"} not in {folder}: a partial download. '
          'Download it again.')
    out = {}
    for name in files:
      out.update(read(root / name) or {})
    return out if arrays else None
  pickles = [n for n in PICKLES if paths.is_file(root / n)]
  if pickles:
    raise errors.CheckpointError(
        f'{folder} holds {pickles[0]} (a torch pickle) and no {WEIGHTS}: vit_jax reads '
        'safetensors only. Save it again with safe serialisation (timm: save_for_hf(..., '
        'safe_serialization=True); transformers: save_pretrained), or use a Hub revision that '
        'has model.safetensors.')
  raise errors.MissingFileError(f'{folder} has a {CONFIG} but no {WEIGHTS}: the weights are '
                                'missing.')


def write_folder(folder: str | os.PathLike, tensors: Mapping[str, np.ndarray],
                 config: Mapping[str, Any], extra: Mapping[str, Any] | None = None,
                 metadata: dict[str, str] | None = None) -> None:
  """Writes ``config.json`` and ``model.safetensors`` (with ``metadata``: transformers'
  ``{'format': 'pt'}``) and ``extra`` JSON files into ``folder``, each renamed into place once
  all are written (``paths.atomic_files``)."""
  import safetensors.numpy

  root = paths.path(folder)
  arrays = {k: np.ascontiguousarray(v, np.float32) for k, v in tensors.items()}
  texts = {name: json.dumps(content, indent=2) + '\n'
           for name, content in {CONFIG: config, **(extra or {})}.items()}
  # Every file written in full before any is renamed into place: nothing half-written is left
  # (a full disk: one error, no temporaries).
  with paths.atomic_files(root / WEIGHTS, *(root / name for name in texts)) as (weights, *tmps):
    weights.write_bytes(safetensors.numpy.save(arrays, metadata))
    for tmp, text in zip(tmps, texts.values(), strict=True):
      tmp.write_text(text)


# ---------------------------------------------------------------------------
# The name tables.

# How torch lays out an array that the release layout stores otherwise.
SAME = 'same'
LINEAR = 'linear'  # A Linear's (out, in) weight: the release's (in, out) kernel.
CONV = 'conv'  # A Conv2d's (out, in, h, w) kernel: the release's (h, w, in, out).
HEADS_IN = 'heads_in'  # (heads * head_dim, width): the release's (width, heads, head_dim).
HEADS_BIAS = 'heads_bias'  # (heads * head_dim,): the release's (heads, head_dim).
HEADS_OUT = 'heads_out'  # (width, heads * head_dim): the release's (heads, head_dim, width).
# (release key, library key, layout); '{i}' in both keys stands for the block's index.
Rule = tuple[str, str, str]


# layout -> (library array -> release array, given the heads; release array -> library array).
_CONVERSIONS = {
    LINEAR: (lambda x, heads: x.T, lambda x: x.T),
    CONV: (lambda x, heads: x.transpose(2, 3, 1, 0), lambda x: x.transpose(3, 2, 0, 1)),
    HEADS_IN: (lambda x, heads: x.T.reshape(x.shape[1], heads, -1),
               lambda x: x.reshape(x.shape[0], -1).T),
    HEADS_BIAS: (lambda x, heads: x.reshape(heads, -1), lambda x: x.reshape(-1)),
    HEADS_OUT: (lambda x, heads: x.T.reshape(heads, -1, x.shape[0]),
                lambda x: x.reshape(-1, x.shape[-1]).T),
    SAME: (lambda x, heads: x, lambda x: x)}


def expand(rules: Iterable[Rule], depth: int, prefix: str = '') -> list[Rule]:
  """The rules with each block's written out (``{i}`` = 0 .. depth - 1), library keys under
  ``prefix``."""
  out = []
  for ours, theirs, layout in rules:
    for i in range(depth) if '{i}' in ours else (None,):
      out.append((ours.format(i=i), prefix + theirs.format(i=i), layout))
  return out


def norm(ours: str, theirs: str) -> tuple[Rule, ...]:
  """A LayerNorm's scale and bias (torch: weight, bias)."""
  return ((ours + '/scale', theirs + '.weight', SAME), (ours + '/bias', theirs + '.bias', SAME))


def dense(ours: str, theirs: str, kernel: str = LINEAR, bias: str = SAME
           ) -> tuple[Rule, ...]:
  """A Linear's (or a Conv2d's, ``kernel=CONV``) kernel and bias."""
  return ((ours + '/kernel', theirs + '.weight', kernel), (ours + '/bias', theirs + '.bias', bias))


def attention(ours: str, theirs: Sequence[str]) -> tuple[Rule, ...]:
  """Separate query, key, value and output projections (``theirs``, in that order)."""
  q, k, v, out = theirs
  return (*dense(ours + 'query', q, HEADS_IN, HEADS_BIAS),
          *dense(ours + 'key', k, HEADS_IN, HEADS_BIAS),
          *dense(ours + 'value', v, HEADS_IN, HEADS_BIAS), *dense(ours + 'out', out, HEADS_OUT))


def read_table(rules: Iterable[Rule], t: Tensors, heads: int) -> dict[str, np.ndarray]:
  """The release-layout arrays of the library tensors the rules name (those present)."""
  return {ours: _CONVERSIONS[layout][0](t(theirs), heads)
          for ours, theirs, layout in rules if theirs in t}


def write_table(rules: Iterable[Rule], flat: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The library tensors of the release-layout arrays the rules name (those present)."""
  return {theirs: _CONVERSIONS[layout][1](np.asarray(flat[ours]))
          for ours, theirs, layout in rules if ours in flat}


class Tensors:
  """A state dict read key by key, so that what was not read can be refused by name."""

  def __init__(self, tensors: Mapping[str, np.ndarray], origin: str, prefix: str = ''):
    self.tensors, self.origin, self.prefix = dict(tensors), origin, prefix
    self.used: set[str] = set()

  def __contains__(self, key: str) -> bool:
    return self.prefix + key in self.tensors

  def __call__(self, key: str) -> np.ndarray:
    key = self.prefix + key
    if key not in self.tensors:
      raise errors.CheckpointError(f'{self.origin}: {key} is missing from the weights.')
    self.used.add(key)
    return np.asarray(self.tensors[key], np.float32)

  def blocks(self, stem: str) -> int:
    """How many blocks ``stem``0, 1, ... there are. Each must hold the tensors the others hold:
    a block that differs has its odd tensor named (a stray tensor is not another model)."""
    pattern = re.compile(re.escape(self.prefix + stem) + r'(\d+)\.(.+)$')
    blocks: dict[int, set[str]] = {}
    for key in self.tensors:
      if m := pattern.match(key):
        blocks.setdefault(int(m.group(1)), set()).add(m.group(2))
    where = f'{self.origin}: {self.prefix}{stem}'
    if not blocks:
      raise errors.CheckpointError(f'{where}0, 1, ... are not in the weights: not a ViT.')
    # The tensors of a block: those most blocks hold (on a tie, the fewer: a stray adds one).
    counts = collections.Counter(frozenset(v) for v in blocks.values())
    usual = min(counts, key=lambda names: (-counts[names], len(names)))
    for i, names in sorted(blocks.items()):
      extra, missing = sorted(names - usual), sorted(usual - names)
      if extra or len(names) < len(usual) / 2:
        odd = extra or sorted(names)
        raise errors.CheckpointMismatchError(
            f'{where}{i}.{odd[0]} has no counterpart in vit_jax\'s ViT: block {i} holds '
            f'{len(names)} tensors, the other blocks {len(usual)}.')
      if missing:
        raise errors.CheckpointMismatchError(f'{where}{i}.{missing[0]} is missing from the '
                                             'weights (the other blocks have it).')
    if set(blocks) != set(range(len(blocks))):
      gap = min(set(range(len(blocks))) - set(blocks))
      raise errors.CheckpointMismatchError(f'{where}{gap} is missing, but block {max(blocks)} is '
                                           'there: the blocks are not numbered 0, 1, ...')
    return len(blocks)

  def check_all_used(self, library: str) -> None:
    left = sorted(set(self.tensors) - self.used)
    if left:
      more = f' and {len(left) - 3} more' if len(left) > 3 else ''
      raise errors.CheckpointMismatchError(
          f'{self.origin}: the {library} weights {", ".join(left[:3])}{more} have no '
          'counterpart in vit_jax\'s ViT (no model option holds them).')


def refuse(origin: str, what: str, hint: str = '') -> errors.CheckpointMismatchError:
  """What a checkpoint holds that vit_jax's ViT cannot compute, in one line."""
  return errors.CheckpointMismatchError(
      f'{origin}: {what}, which vit_jax\'s ViT has no model option for{hint}.')


def export_refusal(model: VisionTransformer, library: str, what: str,
                   other: str = 'npz') -> errors.CheckpointError:
  """What of ``model`` a library cannot hold, and the format that can."""
  return errors.CheckpointError(
      f'{library} cannot hold {model.model_name or "this model"}: {what}. Export it as '
      f"format='{other}' (--format={other}), or fine-tune a model without it.")


def conv_of_linear_patches(weight: np.ndarray, patch: tuple[int, int]) -> np.ndarray:
  """A Linear patch embedding (D, ph * pw * 3) of each patch's (row, column, channel) pixels
  (SigLIP 2's, timm's NaFlexVit's) as the Conv2d kernel (D, 3, ph, pw) that computes the same."""
  return np.asarray(weight).reshape(weight.shape[0], *patch, -1).transpose(0, 3, 1, 2)


def linear_of_conv_patches(kernel: np.ndarray) -> np.ndarray:
  """A Conv2d patch-embedding kernel (D, 3, ph, pw) as the Linear of each patch's (row, column,
  channel) pixels that computes the same: ``conv_of_linear_patches``' inverse."""
  return kernel.transpose(0, 2, 3, 1).reshape(kernel.shape[0], -1)


def fold_patch_bias(model: VisionTransformer, flat: dict[str, np.ndarray]) -> None:
  """For a library whose patch embedding has no bias (timm's pre_norm ViTs, CLIP's): the bias
  moves into the patches' position embeddings (both are added to every patch, before any
  norm)."""
  bias = flat.pop('embedding/bias')
  flat[POSEMB_KEY] = flat[POSEMB_KEY] + np.pad(
      np.broadcast_to(bias, (model.grid[0] * model.grid[1], model.hidden_size)),
      ((model.posemb_prefix_rows, 0), (0, 0)))[None].astype(np.float32)


def embed_prefix(model: VisionTransformer, flat: dict[str, np.ndarray]) -> None:
  """Zero position-embedding rows for the prefix tokens that ``model`` embeds without one,
  for a library that embeds every token: [cls; x + pe] is [cls + 0; x + pe]."""
  rows = model.num_prefix_tokens - model.posemb_prefix_rows
  flat[POSEMB_KEY] = np.pad(flat[POSEMB_KEY], ((0, 0), (rows, 0), (0, 0)))


def check_export(model: VisionTransformer, library: str, more: Iterable[tuple] = (),
                 eva: bool = False) -> None:
  """Refuses (``export_refusal``) what neither library's ViT computes, then the first of the
  library's own ``more`` checks: (whether ``model`` has it, what it is[, the format that can]).
  ``eva``: written as a timm Eva, which may have no absolute position embedding."""
  checks = (
      (model.resnet_layers is not None, 'a hybrid (BiT stem)'),
      (model.posemb not in ('learn', *(('none',) if eva else ())),
       f'posemb={model.posemb!r} (fixed position embeddings)'),
      (model.parallel_block, 'parallel_block=True'),
      (model.norm != 'layernorm', f'norm={model.norm!r}'),
      (bool(model.mpp_outputs), 'mpp_outputs (masked patch prediction)'),
      *((bad, what, 'timm') for bad, what in (
          (model.rope, f'rope={model.rope!r} (rotary position embeddings)'),
          (model.qkv_bias and not model.key_bias, 'key_bias=False (no bias on the keys)'),
          (model.mlp_norm, 'mlp_norm (a norm inside the MLP)'),
          (model.attention_norm, 'attention_norm (a norm inside the attention)'),
          (model.map_heads, f'map_heads={model.map_heads} (a MAP head of its own heads)'))
        if not eva),
  )
  for bad, what, *other in (*checks, *more):
    if bad:
      raise export_refusal(model, library, what, *other)
