"""What a trained ViT learned: the analyses of the paper's section 4.5, as plain arrays.

``embedding_pca``: principal components of the patch-embedding filters (figure 7, left);
``position_similarity``: cosine similarity of the position embeddings (figure 7, centre);
``attention_weights`` / ``attention_distance``: the mean distance in pixels each head attends
over, per layer (figure 7, right; a CNN's receptive field, in effect); ``rollout`` /
``rollout_maps``: attention rollout (Abnar & Zuidema, 2020), each input patch's contribution to
the output token (figure 6). The plotting lives in ``vit_jax.tools.inspect``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.base.sizes import pair
from vit_jax.checkpoints.formats import layout
from vit_jax.models import VisionTransformer, naflex
from vit_jax.models.posemb import posemb_sincos_2d

Array = jax.Array
POSEMB = ('Transformer', 'posembed_input', 'pos_embedding')


def capturing_model(model: VisionTransformer) -> VisionTransformer:
  """The same model with plain (einsum) attention, which records its weights.

  The fused kernels ('xla', 'cudnn') compute the same function but do not expose
  the attention matrix; the parameters are identical, so they apply unchanged.
  """
  return model if model.attention_impl == 'einsum' else model.clone(attention_impl='einsum')


def _encoder_weights(intermediates: Mapping[str, Any], num_layers: int) -> Array:
  """The sown encoder attention weights, stacked: (layers, batch, heads, T, T)."""
  def sown(block: str) -> Array:
    (weights,) = intermediates['Transformer'][block]['MultiHeadDotProductAttention_1'][
        'attention_weights']
    return weights

  if 'encoderblock' in intermediates['Transformer']:  # nn.scan: one, with a layer axis.
    return sown('encoderblock')
  return jnp.stack([sown(f'encoderblock_{i}') for i in range(num_layers)])


def attention_weights(model: VisionTransformer, params: Mapping[str, Any],
                      images: Array) -> tuple[Array, Array]:
  """Logits and every encoder layer's attention weights for a batch of images.

  Returns ``(logits, weights)`` with weights of shape (layers, batch, heads,
  tokens, tokens), rows (queries) summing to one. The logits are those of
  ``model.apply(..., train=False)`` up to float32 rounding: the weights are only
  recorded (``sow``), but the last block then computes every token's output, not
  the class token's only (``VisionTransformer.head_tokens``). The attention
  pooling of ``pool='map'`` is not an encoder layer and is left out.
  """
  model = capturing_model(model)
  logits, state = model.apply({'params': params}, images, train=False,
                              mutable=['intermediates'])
  return logits, _encoder_weights(state['intermediates'], model.num_layers)


def token_spacing(model: VisionTransformer) -> tuple[float, float]:
  """The (vertical, horizontal) distance in input pixels between neighbouring tokens."""
  (h, w), (gh, gw) = pair(model.image_size), model.grid
  return (h / gh, w / gw)


def patch_distances(grid: tuple[int, int], spacing: tuple[float, float]) -> np.ndarray:
  """(N, N) Euclidean distances in pixels between the centres of the grid's patches."""
  rows, cols = np.mgrid[:grid[0], :grid[1]]
  y = rows.reshape(-1) * spacing[0]
  x = cols.reshape(-1) * spacing[1]
  return np.sqrt((y[:, None] - y[None]) ** 2 + (x[:, None] - x[None]) ** 2)


def attention_distance(weights: Array, grid: tuple[int, int], spacing: tuple[float, float],
                       num_prefix_tokens: int) -> Array:
  """Mean attention distance in pixels per head: weights (..., heads, T, T) -> (..., heads).

  For every patch query, the distance to every patch key weighted by the
  attention it pays to it, averaged over the queries (the paper's figure 7,
  right, also averages over images: take the mean over the batch axis).
  Prefix (class) tokens have no position: their rows are dropped and the
  weights on patch keys are renormalised to sum to one.
  """
  grid = (int(grid[0]), int(grid[1]))
  n, p = grid[0] * grid[1], int(num_prefix_tokens)
  if weights.shape[-1] - p != n:
    raise ValueError(f'The attention has {weights.shape[-1] - p} patch tokens; a '
                     f'{grid[0]}x{grid[1]} grid has {n}. Pass the model\'s grid and '
                     'num_prefix_tokens.')
  return _attention_distance(weights, grid, (float(spacing[0]), float(spacing[1])), p)


@functools.partial(jax.jit, static_argnames=('grid', 'spacing', 'p'))
def _attention_distance(weights: Array, grid: tuple[int, int], spacing: tuple[float, float],
                        p: int) -> Array:
  w = jnp.asarray(weights, jnp.float32)[..., p:, p:]
  w = w / jnp.maximum(w.sum(-1, keepdims=True), 1e-12)
  distances = jnp.asarray(patch_distances(grid, spacing), jnp.float32)
  return jnp.einsum('...qk,qk->...q', w, distances, precision='highest').mean(-1)


def uniform_distance(grid: tuple[int, int], spacing: tuple[float, float]) -> float:
  """The attention distance of a head that attends to all patches equally."""
  return float(patch_distances(grid, spacing).mean())


@jax.jit
def rollout(weights: Array) -> Array:
  """Attention rollout (Abnar & Zuidema, 2020): (layers, batch, heads, T, T) -> (batch, T, T).

  Per layer, the heads are averaged and the identity added (the residual
  connection), the rows renormalised to sum to one; the layers are multiplied
  from the first to the last. Row ``i`` of the result is how much the output at
  token ``i`` draws on each input token.
  """
  a = jnp.asarray(weights, jnp.float32).mean(axis=2)
  eye = jnp.eye(a.shape[-1], dtype=a.dtype)
  a = a + eye
  a = a / a.sum(-1, keepdims=True)

  def step(total: Array, layer: Array) -> tuple[Array, None]:
    return jnp.matmul(layer, total, precision='highest'), None

  total, _ = jax.lax.scan(step, jnp.broadcast_to(eye, a.shape[1:]), a)
  return total


def rollout_maps(weights: Array, grid: tuple[int, int], num_prefix_tokens: int,
                 token: bool | None = None) -> Array:
  """Per image, the rollout of the token the classifier reads, on the patch grid.

  With a class token that the classifier reads (``token``; by default where there are
  prefix tokens), its row of the rollout; else (global average pooling), the mean over
  the patches' rows. Returns (batch, rows, columns), each map scaled to a maximum of one.
  """
  token = num_prefix_tokens > 0 if token is None else token
  return _rollout_maps(weights, (int(grid[0]), int(grid[1])), int(num_prefix_tokens),
                       bool(token))


@functools.partial(jax.jit, static_argnames=('grid', 'p', 'token'))
def _rollout_maps(weights: Array, grid: tuple[int, int], p: int, token: bool) -> Array:
  total = rollout(weights)
  row = total[:, 0] if token else total[:, p:].mean(axis=1)
  maps = row[:, p:].reshape(-1, *grid)
  return maps / jnp.maximum(maps.max(axis=(1, 2), keepdims=True), 1e-12)


def attention_summary(model: VisionTransformer, params: Any,
                      images: Array) -> tuple[Array, Array, Array]:
  """``model``'s (a ``capturing_model``) logits, attention distance (N, layers, heads) and
  rollout maps (N, rows, cols) of ``images``: what ``vit_jax.tools.inspect`` draws."""
  grid, prefix = model.grid, model.num_prefix_tokens
  logits, weights = attention_weights(model, params, images)
  distance = attention_distance(weights, grid, token_spacing(model), prefix)
  return logits, distance.transpose(1, 0, 2), rollout_maps(weights, grid, prefix,
                                                            model.pool == 'token')


def position_embeddings(model: VisionTransformer, params: Mapping[str, Any]) -> np.ndarray:
  """The patches' position embeddings, (rows * columns, width); prefix tokens dropped."""
  grid = model.grid
  if model.posemb == 'sincos2d':
    return posemb_sincos_2d(grid, model.hidden_size)[0]
  params = layout.unwrap(params)
  table = np.asarray(params[POSEMB[0]][POSEMB[1]][POSEMB[2]], np.float32)[0]
  table = table[model.posemb_prefix_rows:]
  if len(table) != grid[0] * grid[1]:
    raise ValueError(f'{len(table)} position embeddings do not fit the model\'s '
                     f'{grid[0]}x{grid[1]} grid.')
  return table


def position_similarity(posemb: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
  """Cosine similarity of each position embedding to all: (rows, cols, rows, cols).

  ``result[i, j]`` is the map, over the grid, of the similarity to the patch at
  row ``i``, column ``j``.
  """
  e = np.asarray(posemb, np.float64)
  e = e / np.maximum(np.linalg.norm(e, axis=-1, keepdims=True), 1e-12)
  return (e @ e.T).reshape(*grid, *grid)


def embedding_pca(kernel: np.ndarray, num_components: int = 28) -> tuple[np.ndarray, np.ndarray]:
  """Principal components of the patch-embedding filters.

  ``kernel`` is the (P, P, channels, width) embedding convolution: ``width``
  filters of P x P x channels. Returns the first components as filters
  (components, P, P, channels), each of unit norm, its largest entry positive,
  and the fraction of the filters' variance each explains.
  """
  k = np.asarray(kernel, np.float64)
  *shape, width = k.shape
  filters = k.reshape(-1, width).T  # (width, P * P * channels): one row per filter.
  filters = filters - filters.mean(axis=0, keepdims=True)
  _, s, vt = np.linalg.svd(filters, full_matrices=False)
  variance = s**2
  ratio = variance / max(variance.sum(), 1e-30)
  n = min(num_components, len(s))
  components = vt[:n]
  signs = np.sign(components[np.arange(n), np.abs(components).argmax(axis=1)])
  components = components * np.where(signs == 0, 1., signs)[:, None]
  return components.reshape(n, *shape), ratio[:n]


def model_inputs(batch: Any) -> Any:
  """The model's input of a batch of preprocessed examples: a ``naflex.PatchSequence`` where
  they are patch sequences (a dict of ``preprocess.PATCH_KEYS``: ``naflex.inputs``), else the
  images themselves."""
  return naflex.inputs(batch) if isinstance(batch, Mapping) else batch


def top_k(probabilities: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """The indices and values of the ``k`` largest entries of each row, descending."""
  probabilities = np.asarray(probabilities)
  k = min(k, probabilities.shape[-1])
  order = np.argsort(-probabilities, axis=-1, kind='stable')[..., :k]
  return order, np.take_along_axis(probabilities, order, axis=-1)


def probabilities(logits: Array | np.ndarray, activation: str) -> np.ndarray:
  """Class probabilities (numpy, on the host): 'softmax' (one label) or 'sigmoid' (several)."""
  if activation not in ('softmax', 'sigmoid'):
    raise ValueError(f"activation={activation!r} is not 'softmax' or 'sigmoid'.")
  logits = np.asarray(logits, np.float64)
  if activation == 'sigmoid':
    return 1. / (1. + np.exp(-logits))
  e = np.exp(logits - logits.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)
