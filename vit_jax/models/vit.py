"""The Vision Transformer (Dosovitskiy et al., ICLR 2021, section 3.1).

    z_0  = [x_class; x_p^1 E; ...; x_p^N E] + E_pos
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}
    z_l  = MLP(LN(z'_l)) + z'_l
    y    = LN(z_L^0)

Module and parameter names are those of the released .npz files, so an unrolled model's
``params`` *is* the release layout (docs/checkpoints.md); ``scan=True`` stacks the blocks into
one ``Transformer/encoderblock`` (``vit_jax.checkpoints.formats.layout`` converts). ViT-22B's
block options, timm's families' options (``registers``, ``ls1``/``ls2``, ``fc_norm``; the prefix
tokens' rows of ``pos_embedding``), masked patch prediction (``mask_token``, ``mpp_head``) and
the hybrids' BiT stem keep those names and only add or drop parameters: with them off, the
parameters are the release's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.base import sharding
from vit_jax.base.sizes import pair
from vit_jax.models import naflex, posemb, resnet
from vit_jax.models.layers import (
  ACTIVATIONS,
  LN_EPSILON,
  BlockOptions,
  MlpBlock,
  MultiHeadAttention,
  dense_init,
)
from vit_jax.models.posemb import POSEMBS

Array = jax.Array
Dtype = Any

NORMS = ('layernorm', 'rmsnorm')
POOLS = ('token', 'gap', 'map')
ATTENTION_IMPLS = ('auto', 'einsum', 'xla', 'cudnn')
REMAT_POLICIES = {
    'none': None,
    'full': jax.checkpoint_policies.nothing_saveable,
    'dots': jax.checkpoint_policies.checkpoint_dots,
    'dots_no_batch': jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def drop_path(x: Array, rate: float | Array, rng: Array) -> Array:
  """Stochastic depth: zeroes whole examples of a residual branch."""
  keep = 1. - rate
  mask = jax.random.bernoulli(rng, keep, (x.shape[0],) + (1,) * (x.ndim - 1))
  return jnp.where(mask, x / keep, 0).astype(x.dtype)


class EncoderBlock(nn.Module):
  """One pre-LayerNorm Transformer block: x + MSA(LN(x)), then x + MLP(LN(x)).

  ``parallel_block``: x + MSA(LN(x)) + MLP(LN(x)) with one LayerNorm (ViT-22B, PaLM);
  its parameters keep the names of the sequential block's (no ``LayerNorm_2``).
  ``layer_scale``: each branch times a learned per-channel scale, ``ls1`` (attention) and
  ``ls2`` (MLP), initialised to that value (CaiT, DeiT III).
  Returns ``(x, None)`` so that the same module can be ``nn.scan``-ned.
  """

  options: BlockOptions
  stochastic_depth: bool = False  # Drop-path, at the rate the encoder passes each block.

  @nn.compact
  def __call__(self, x: Array, positions: Array | None, drop_path_rate: float | Array,
               deterministic: bool, query_tokens: int | None = None,
               key_mask: Array | None = None) -> tuple[Array, None]:
    """``positions``: the patches' rotary coordinates (``MultiHeadAttention``), None without
    a rotary encoding. ``query_tokens``: compute only the first this many tokens' outputs (all
    tokens are still keys and values); the rest are not computed and not returned.
    ``key_mask`` (batch, tokens) bool: the tokens attended to (a patch sequence's padding is
    not), or (batch, tokens, tokens) per query (a packed sequence's); None: all."""
    o = self.options
    mlp = lambda: MlpBlock(o, name='MlpBlock_3')

    def scaled(name: str, branch: Array) -> Array:
      if o.layer_scale is None:
        return branch
      gamma = self.param(name, nn.initializers.constant(o.layer_scale), (branch.shape[-1],),
                         o.param_dtype)
      return branch * gamma.astype(branch.dtype)

    def residual(branch: Array) -> Array:
      if self.stochastic_depth and not deterministic:
        branch = drop_path(branch, drop_path_rate, self.make_rng('dropout'))
      return branch

    y = queries = o.norm_layer('LayerNorm_0')(x)
    if query_tokens is not None:  # LayerNorm is per token: slicing after it is exact.
      x, queries = x[:, :query_tokens], y[:, :query_tokens]
    y = MultiHeadAttention(o, name='MultiHeadDotProductAttention_1')(
        queries, y, deterministic=deterministic, positions=positions, key_mask=key_mask)
    y = scaled('ls1', nn.Dropout(o.dropout_rate)(y, deterministic=deterministic))
    if o.parallel_block:
      y = y + scaled('ls2', mlp()(queries, deterministic=deterministic))
      return sharding.constrain(x + residual(y), 'tokens'), None
    x = sharding.constrain(x + residual(y), 'tokens')

    y = scaled('ls2', mlp()(o.norm_layer('LayerNorm_2')(x), deterministic=deterministic))
    return sharding.constrain(x + residual(y), 'tokens'), None


class Encoder(nn.Module):
  """Position embeddings, ``num_layers`` blocks (unrolled or scanned), final LayerNorm.

  ``posemb``: the absolute encoding added to the tokens, and ``options.rope`` the rotary one
  of every attention (``vit_jax.models.posemb``). ``prefix_posemb``: the prefix tokens get
  learned position embeddings too (the release's layout); else only the patches do.
  ``final_norm=False`` leaves out the final LayerNorm (the model normalises after pooling
  instead: ``fc_norm``). ``pre_norm``: a LayerNorm on the embedded tokens before the first
  block, ``pre_norm`` (CLIP's ``ln_pre``).
  """

  num_layers: int
  grid: tuple[int, int]
  options: BlockOptions
  num_prefix_tokens: int = 1
  posemb: str = 'learn'
  stochastic_depth: float = 0.  # The last block's drop-path rate (linear from 0).
  scan: bool = False
  remat_policy: str = 'none'
  prefix_posemb: bool = True
  final_norm: bool = True
  pre_norm: bool = False

  @nn.compact
  def __call__(self, x: Array, *, train: bool, output_tokens: int | None = None,
               sequence: naflex.PatchSequence | None = None) -> Array:
    """``output_tokens``: the last block computes only the first this many tokens' outputs
    (None: all); unrolled blocks only. ``sequence``: the patches of ``x`` are this patch
    sequence's (``naflex``): each at its own image's grid (``grid`` is then the table's, the
    ``image_size`` one), the padding masked out of every attention."""
    o = self.options
    key_mask = None
    if sequence is None:
      x = posemb.add_absolute(x, self.posemb, self.grid, self.num_prefix_tokens,
                              self.prefix_posemb, o.param_dtype)
    else:
      x = naflex.add_absolute(x, sequence, self.posemb, self.grid, self.num_prefix_tokens,
                              self.prefix_posemb, o.param_dtype)
      key_mask = naflex.key_mask(sequence, self.num_prefix_tokens)
    positions = None
    if o.rope and sequence is not None:
      positions = naflex.rope_positions(o.rope, sequence)
    elif o.rope:
      positions = posemb.coordinates(posemb.Rope.parse(o.rope),
                                     *posemb.grid_positions(self.grid))
    x = nn.Dropout(o.dropout_rate)(x, deterministic=not train).astype(o.dtype)
    if self.pre_norm:
      x = o.norm_layer('pre_norm')(x)
    x = sharding.constrain(x, 'tokens')

    block = EncoderBlock
    if self.remat_policy != 'none':
      # Static: `deterministic`, and unrolled blocks' `query_tokens`.
      block = nn.remat(block, policy=REMAT_POLICIES[self.remat_policy],
                       prevent_cse=not self.scan, static_argnums=(4,) if self.scan else (4, 5))
    # The key mask only where there is one: the image path's program is unchanged.
    masked = () if key_mask is None else (None, key_mask)
    # Stochastic depth grows linearly with depth, from 0 to `stochastic_depth`.
    rates = np.linspace(0., self.stochastic_depth, self.num_layers)
    kw = dict(options=o, stochastic_depth=self.stochastic_depth > 0)
    if self.scan:
      if output_tokens is not None:
        raise ValueError('output_tokens needs unrolled blocks (scan=False).')
      use_rates = self.stochastic_depth > 0
      scanned = nn.scan(block, variable_axes={'params': 0, 'intermediates': 0},
                        split_rngs={'params': True, 'dropout': True},
                        in_axes=(nn.broadcast, 0 if use_rates else nn.broadcast,
                                 nn.broadcast) + (nn.broadcast,) * len(masked),
                        length=self.num_layers)
      x, _ = scanned(name='encoderblock', **kw)(
          x, positions, jnp.asarray(rates) if use_rates else 0., not train, *masked)
    else:
      for i in range(self.num_layers):
        last = i == self.num_layers - 1
        x, _ = block(name=f'encoderblock_{i}', **kw)(
            x, positions, float(rates[i]), not train, output_tokens if last else None,
            *masked[1:])
    return o.norm_layer('encoder_norm')(x) if self.final_norm else x


class MAPHead(nn.Module):
  """Multihead attention pooling: a learned probe attends over all tokens (no dropout).

  ``num_heads``: the head's own (PE's attention pool: 8); None: the blocks'."""

  options: BlockOptions
  num_heads: int | None = None

  @nn.compact
  def __call__(self, x: Array, key_mask: Array | None = None) -> Array:
    """The pooled (batch, width); ``key_mask`` (batch, tokens) bool: the tokens the probe
    attends to (None: all); (batch, K, tokens): K probes, one per packed image, each over its
    own image's tokens, pooled (batch, K, width)."""
    # The head's attention takes the blocks' kernel, but none of their dropout, and is a plain
    # one: key biases, no rotation, no inner norms (timm's AttentionPoolLatent).
    o = dataclasses.replace(self.options, dropout_rate=0., attention_dropout_rate=0.,
                            num_heads=self.num_heads or self.options.num_heads, key_bias=True,
                            attention_norm=False, mlp_norm=False, rope=None)
    queries = 1 if key_mask is None or key_mask.ndim == 2 else key_mask.shape[1]
    probe = self.param('probe', dense_init, (1, 1, x.shape[-1]), o.param_dtype)
    probe = jnp.tile(probe, (x.shape[0], queries, 1)).astype(x.dtype)
    x = MultiHeadAttention(o, name='MultiHeadDotProductAttention_0')(
        probe, x, deterministic=True, key_mask=key_mask)
    y = o.norm_layer('LayerNorm_0')(x)
    x = x + MlpBlock(o, name='MlpBlock_0')(y, deterministic=True)
    return x[:, 0] if queries == 1 and (key_mask is None or key_mask.ndim == 2) else x


class VisionTransformer(nn.Module):
  """ViT classifier. ``apply({'params': p}, images, train=False)`` -> float32 logits.

  Attributes:
    num_classes: classifier outputs; 0 or None returns the pooled features.
    patch_size: patch side in pixels (on the ResNet feature map for hybrids).
    hidden_size, num_layers, mlp_dim, num_heads: the encoder's shape.
    image_size: input (height, width) the position embeddings are built for; a model without
      them (posemb='none': a rotary encoding alone) takes any size its patches tile.
    resnet_layers: units per BiT stage for hybrids (``()``: root only); None: no stem.
    resnet_width: BiT width factor.
    pool: 'token' (class token), 'gap' (mean of the patch tokens) or 'map' (attention
      pooling).
    representation_size: width of the Dense + tanh pre-logits layer; None: none.
    head_bias_init: initial classifier bias (-10 for sigmoid pre-training).
    posemb: the absolute position encoding: 'learn' (1-D learned), 'sincos2d' (fixed) or
      'none' (a rotary one alone); ``vit_jax.models.posemb``.
    rope: a rotary position encoding of every block's attention, a ``posemb.Rope`` spec
      ('axial', 'dinov3', 'mixed', "axial(temperature=100.0, xy=True)", ...); None: none.
      The patches' queries and keys turn with their (row, column); the prefix tokens never.
    dropout_rate, attention_dropout_rate: dropout in the blocks / on attention weights.
    stochastic_depth: drop-path rate of the last block (linear in depth from 0).
    attention_impl: 'auto' (cuDNN's fused kernel on NVIDIA GPUs where it applies, else the
      einsum: ``layers.attention_for``), 'einsum', 'xla' or 'cudnn' (``MultiHeadAttention``).
    scan: ``nn.scan`` over the blocks (one compiled block; much faster to compile).
    remat_policy: 'none', 'full', 'dots' or 'dots_no_batch' rematerialisation.
    dtype: compute dtype (e.g. bfloat16); param_dtype: parameter dtype.
    matmul_dtype: if set (bfloat16), the encoder's matmuls take their operands in this
      dtype and accumulate in float32, forward and backward (``models.matmul``);
      everything else computes in ``dtype``. PyTorch's bfloat16 autocast, in effect.
    parallel_block: attention and MLP side by side on one LayerNorm (ViT-22B).
    qk_norm: normalise each head's queries and keys before their product (ViT-22B).
    qkv_bias: biases in the query/key/value projections (ViT-22B has none).
    key_bias: with ``qkv_bias``, the keys' bias too (EVA's attention: queries and values only).
    norm: 'layernorm', or 'rmsnorm' (no centering, no bias: ViT-22B's), everywhere.
    norm_epsilon: every norm's epsilon (1e-6; transformers' ViT: 1e-12).
    activation: the MLP's, 'gelu_tanh' (the tanh-approximate GELU: the releases' and
      big_vision's), 'gelu' (exact, with erf: timm's and transformers' ViTs), 'quick_gelu'
      (x * sigmoid(1.702 x): OpenAI's CLIP) or 'silu' (with ``gated_mlp``: SwiGLU).
    gated_mlp: a gated MLP (``MlpBlock``): its first Dense gives 2 * mlp_dim units, the
      activation of the first half times the second half (DINOv2-g's SwiGLU with 'silu').
    pre_norm: a LayerNorm on the embedded tokens (position embeddings added) before the
      first block, ``Transformer/pre_norm`` (CLIP's ``ln_pre``).
    mlp_norm: a norm on the MLP's hidden units before its output projection (EVA-02's
      ``scale_mlp``, NormFormer).
    attention_norm: a norm on the heads' joined outputs before the attention's output
      projection (EVA-02 CLIP's ``scale_attn_inner``).
    layer_scale: a learned per-channel scale on each residual branch (CaiT, DeiT III),
      initialised to this value; None: none.
    class_token: a class token in front of the patches; None: where ``pool='token'``.
    distill_token: a distillation token after the class token (DeiT), ``dist``, with its own
      classifier ``head_dist``; needs ``pool='token'``. The logits are the two heads' mean
      (as DeiT and timm infer, and train without a teacher); the pooled features (no
      classes), the two tokens' mean (timm's ``pre_logits``).
    num_registers: register tokens after the class (and distillation) token (Darcet et al.,
      2024); they are attended to but never pooled.
    prefix_posemb: the prefix tokens (class token, registers) get learned position
      embeddings as the patches do (the release's layout); False: the patches only (timm's
      ``no_embed_class``, big_vision's layout).
    map_heads: the MAP head's attention heads (PE's attention pool: 8); None: num_heads.
    fc_norm: the final LayerNorm after pooling (``fc_norm``) instead of on every token
      before it (timm's avg-pooled ViTs, MAE).
    mpp_outputs: masked patch prediction (``vit_jax.models.mpp``): > 0 adds a learnable
      ``mask_token`` and an ``mpp_head`` of this many outputs per patch, and the model
      returns (batch, patches, mpp_outputs) float32 predictions instead of logits (no
      pooling, no classifier); 0: off, the release's parameters exactly.
    model_name: the registry name, for logs and exports.
  """

  num_classes: int | None
  patch_size: int | tuple[int, int]
  hidden_size: int
  num_layers: int
  mlp_dim: int
  num_heads: int
  image_size: int | tuple[int, int] = 224
  resnet_layers: tuple[int, ...] | None = None
  resnet_width: int = 1
  pool: str = 'token'
  representation_size: int | None = None
  head_bias_init: float = 0.
  posemb: str = 'learn'
  rope: str | None = None
  dropout_rate: float = 0.
  attention_dropout_rate: float = 0.
  stochastic_depth: float = 0.
  attention_impl: str = 'auto'
  scan: bool = False
  remat_policy: str = 'none'
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  matmul_dtype: Dtype | None = None
  parallel_block: bool = False
  qk_norm: bool = False
  qkv_bias: bool = True
  key_bias: bool = True
  norm: str = 'layernorm'
  norm_epsilon: float = LN_EPSILON
  activation: str = 'gelu_tanh'
  gated_mlp: bool = False
  mlp_norm: bool = False
  attention_norm: bool = False
  pre_norm: bool = False
  layer_scale: float | None = None
  class_token: bool | None = None
  distill_token: bool = False
  num_registers: int = 0
  prefix_posemb: bool = True
  map_heads: int | None = None
  fc_norm: bool = False
  mpp_outputs: int = 0
  model_name: str | None = None

  def __post_init__(self):
    for field, value, allowed in (('pool', self.pool, POOLS), ('posemb', self.posemb, POSEMBS),
                                  ('attention_impl', self.attention_impl, ATTENTION_IMPLS),
                                  ('remat_policy', self.remat_policy, tuple(REMAT_POLICIES)),
                                  ('norm', self.norm, NORMS),
                                  ('activation', self.activation, tuple(ACTIVATIONS))):
      if value not in allowed:
        raise ValueError(f'{field}={value!r} is not one of {allowed}.')
    if self.hidden_size % self.num_heads:
      raise ValueError(f'hidden_size={self.hidden_size} is not divisible by '
                       f'num_heads={self.num_heads}.')
    if self.pool == 'token' and self.class_token is False:
      raise ValueError("pool='token' pools the class token: it needs class_token=True (or "
                       "None), or another pool ('gap', 'map').")
    if self.distill_token and not (self.pool == 'token' and self.has_class_token):
      raise ValueError(f"distill_token=True reads the class and distillation tokens: it needs "
                       f"pool='token', not {self.pool!r}.")
    if self.num_registers < 0:
      raise ValueError(f'num_registers={self.num_registers} must be >= 0.')
    if self.rope is not None:
      rope = posemb.Rope.parse(self.rope)  # ValueError: a wrong spec.
      posemb.frequencies(rope, self.hidden_size // self.num_heads)  # A head_dim it can turn.
      object.__setattr__(self, 'rope', str(rope))  # One spelling of each rope.
    if self.map_heads is not None and self.hidden_size % self.map_heads:
      raise ValueError(f'hidden_size={self.hidden_size} is not divisible by '
                       f'map_heads={self.map_heads}.')
    super().__post_init__()

  @property
  def block_options(self) -> BlockOptions:
    """The options every encoder block takes from this model."""
    return BlockOptions(**{f.name: getattr(self, f.name)
                           for f in dataclasses.fields(BlockOptions)})

  @property
  def stem_stride(self) -> int:
    """Downsampling of the BiT stem (1 without one)."""
    if self.resnet_layers is None:
      return 1
    return 4 * 2**max(len(self.resnet_layers) - 1, 0)

  @property
  def grid(self) -> tuple[int, int]:
    """The (rows, columns) of patches for an ``image_size`` input."""
    ph, pw = pair(self.patch_size)
    h, w = (math.ceil(s / self.stem_stride) for s in pair(self.image_size))  # SAME padding.
    return (h // ph, w // pw)

  @property
  def has_class_token(self) -> bool:
    return self.pool == 'token' if self.class_token is None else self.class_token

  @property
  def num_prefix_tokens(self) -> int:
    """The tokens in front of the patches: the class token, the distillation token, then the
    registers."""
    return int(self.has_class_token) + int(self.distill_token) + self.num_registers

  @property
  def posemb_prefix_rows(self) -> int:
    """The rows of the learned position embeddings in front of the patches' rows."""
    return self.num_prefix_tokens if self.prefix_posemb and self.posemb == 'learn' else 0

  @property
  def head_tokens(self) -> int | None:
    """How many leading tokens the last block computes outputs for (None: all of them).

    With a class token only that one reaches the head, so the last block computes no other
    token's output (they are still its keys and values): the logits are the same, and the
    matmul work falls by nearly 1/num_layers (ViT-Ti/16, S/16, B/16: 7%); two with a
    distillation token. All tokens for 'gap' / 'map' pooling, for scanned blocks (one shape
    for all), and where the caller collects 'intermediates' (every layer's full attention
    weights).
    """
    if self.mpp_outputs:  # Every patch's final representation is predicted from.
      return None
    return 1 + int(self.distill_token) if self.pool == 'token' and not self.scan else None

  def forward_flops(self, all_tokens: bool = False) -> int | None:
    """Matmul FLOPs of one image's forward pass (2 per multiply-add); None for hybrids.

    Per block of T tokens, Q of them queries (T, but ``head_tokens`` in the last block),
    width D, MLP width M: 4 T D^2 (k, v) + 4 Q D^2 (q, out) + 4 Q T D
    (logits, weighted sum) + 4 Q D M (MLP; 6 Q D M gated). ``all_tokens=True`` counts Q = T in every
    block: the count that papers and timm publish. Element-wise work (LayerNorm, GELU,
    softmax) is not counted, as in those figures; a training step costs about 3x this.
    The BiT stem of hybrids is not modelled: use XLA's count there.
    """
    if self.resnet_layers is not None:
      return None
    (ph, pw), (gh, gw) = pair(self.patch_size), self.grid
    n, d, m = gh * gw, self.hidden_size, self.mlp_dim
    t = n + self.num_prefix_tokens
    mlp = (6 if self.gated_mlp else 4) * d * m  # Per token.
    block = lambda q: 4 * t * d * d + 4 * q * d * d + 4 * q * t * d + q * mlp
    last = t if all_tokens or self.head_tokens is None else self.head_tokens
    flops = 2 * n * ph * pw * 3 * d  # Patch embedding.
    flops += (self.num_layers - 1) * block(t) + block(last)
    if self.mpp_outputs:  # The per-patch head instead of pooling and classifier.
      return flops + 2 * n * d * self.mpp_outputs
    if self.pool == 'map':  # One probe query over t keys and values, then an MLP.
      flops += 4 * d * d + 4 * t * d * d + 4 * t * d + mlp
    width, heads = d, 1 + int(self.distill_token)  # Each pooled token has its own head.
    if self.representation_size is not None:
      flops += 2 * d * self.representation_size * heads
      width = self.representation_size
    return flops + 2 * width * (self.num_classes or 0) * heads

  @nn.compact
  def __call__(self, inputs: Array | naflex.PatchSequence, *, train: bool = False,
               corruption: tuple[Array, Array] | None = None, both_heads: bool = False) -> Any:
    """Logits (batch, classes); with ``mpp_outputs``, per-patch predictions.

    ``inputs``: NHWC images, or a ``naflex.PatchSequence`` (each image at its own grid, cut
    into patches and padded): the same parameters, embedded patch by patch with the position
    embeddings resized to each image's grid; the padding is masked out of every attention and
    pool.

    ``both_heads``: with ``distill_token``, the class and distillation heads' logits as a pair
    instead of their mean (DeiT's training with a teacher, ``vit_jax.training.step``).

    ``corruption``: masked patch prediction's ``(mask, source)``, both (batch, patches)
    (``vit_jax.models.mpp.corrupt``): patch i's embedding is replaced by patch ``source[i]``'s of
    the same image (itself where it is unchanged), then by the mask embedding where
    ``mask``; before the position embeddings are added. None: no corruption.
    """
    if isinstance(inputs, naflex.PatchSequence):
      return self.encode_and_pool(*self.embed_sequence(inputs), train=train,
                                  both_heads=both_heads, corruption=corruption)
    images = inputs
    expected = pair(self.image_size) + (3,)
    # Without position embeddings (a rotary encoding alone) any size whose sides the patches
    # tile computes as it would: the encoding follows the grid.
    sides, patch = images.shape[1:3], pair(self.patch_size)
    any_size = (self.posemb == 'none' and self.resnet_layers is None and images.ndim == 4
                and images.shape[-1] == 3 and sides[0] % patch[0] == 0
                and sides[1] % patch[1] == 0)
    if not any_size and (images.ndim != 4 or tuple(images.shape[1:]) != expected):
      raise ValueError(
          f'{self.model_name or "VisionTransformer"} expects NHWC images of shape '
          f'(batch, {expected[0]}, {expected[1]}, 3) in [-1, 1], got {tuple(images.shape)}. '
          'Resize the images, or build the model with image_size=(height, width) '
          '(vit_jax.checkpoints.formats.release.load_pretrained resizes the position '
          'embeddings).')
    x = images.astype(self.dtype)
    if self.resnet_layers is not None:
      x = resnet.bit_stem(x, self.resnet_layers, self.resnet_width, dtype=self.dtype,
                          param_dtype=self.param_dtype)

    x = self.patch_embedding(x)
    n, h, w, c = x.shape
    assert any_size or (h, w) == self.grid, ((h, w), self.grid)
    return self.encode_and_pool(x.reshape(n, h * w, c), (h, w), train=train,
                                both_heads=both_heads, corruption=corruption)

  def patch_embedding(self, x: Array) -> Array:
    """The patch embedding, ``embedding``: a patch_size convolution of stride patch_size."""
    return nn.Conv(self.hidden_size, pair(self.patch_size), strides=pair(self.patch_size),
                   padding='VALID', name='embedding', dtype=self.dtype,
                   param_dtype=self.param_dtype)(x)

  def embed_sequence(self, seq: naflex.PatchSequence) -> tuple[Array, tuple[int, int],
                                                               naflex.PatchSequence]:
    """A patch sequence's tokens (batch, N, width), the ``image_size`` grid (the position
    embeddings' table) and the sequence, for ``encode_and_pool``."""
    name = self.model_name or 'VisionTransformer'
    if self.resnet_layers is not None:
      raise ValueError(f'{name} is a hybrid (a ResNet stem before the patches): it takes '
                       'images, not patch sequences.')
    if self.mpp_outputs:
      raise ValueError(f'{name} predicts masked patches (mpp_outputs): it takes images, not '
                       'patch sequences.')
    seq.check(pair(self.patch_size), name)
    if seq.packed and self.num_prefix_tokens:
      raise ValueError(f'{name} has prefix tokens (pool={self.pool!r}, class token, '
                       'registers): a packed patch sequence takes a model that pools each '
                       "image's own patches, pool='gap' or 'map'.")
    x = naflex.embed(self.patch_embedding, seq.patches.astype(self.dtype), pair(self.patch_size))
    return x, self.grid, seq

  def encode_and_pool(self, x: Array, grid: tuple[int, int],
                      sequence: naflex.PatchSequence | None = None, *, train: bool,
                      both_heads: bool, corruption: tuple[Array, Array] | None) -> Any:
    """Everything after the patch embedding, shared by images and patch sequences: the
    prefix tokens, the encoder, the pool and the heads. ``x`` (batch, patches, width) the
    embedded patches of a ``grid``; ``sequence``: they are this patch sequence's (its padding
    masked out of attention and pooling)."""
    kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    n, _, c = x.shape
    if self.mpp_outputs:
      mask_token = self.param('mask_token', nn.initializers.normal(stddev=0.02), (1, 1, c),
                              self.param_dtype)
      if corruption is not None:
        mask, source = corruption
        x = jnp.take_along_axis(x, source[..., None].astype(jnp.int32), axis=1)
        x = jnp.where(mask[..., None], mask_token.astype(x.dtype), x)
    elif corruption is not None:
      raise ValueError('corruption needs a model built with mpp_outputs > 0.')
    prefix = []
    if self.has_class_token:
      prefix.append(self.param('cls', nn.initializers.zeros, (1, 1, c), self.param_dtype))
    if self.distill_token:  # Initialised apart from the class token (timm's N(0, 0.02)).
      prefix.append(self.param('dist', nn.initializers.normal(stddev=0.02), (1, 1, c),
                               self.param_dtype))
    if self.num_registers:
      prefix.append(self.param('registers', nn.initializers.normal(stddev=1e-6),
                               (1, self.num_registers, c), self.param_dtype))
    if prefix:
      x = jnp.concatenate([jnp.tile(t, (n, 1, 1)).astype(x.dtype) for t in prefix] + [x],
                          axis=1)

    output_tokens = None if self.is_mutable_collection('intermediates') else self.head_tokens
    x = Encoder(
        num_layers=self.num_layers, grid=grid, options=self.block_options,
        num_prefix_tokens=self.num_prefix_tokens, posemb=self.posemb,
        stochastic_depth=self.stochastic_depth, scan=self.scan, remat_policy=self.remat_policy,
        prefix_posemb=self.prefix_posemb, final_norm=not self.fc_norm, pre_norm=self.pre_norm,
        name='Transformer')(x, train=train, output_tokens=output_tokens, sequence=sequence)
    # Unpacked: (batch, tokens); packed: (batch, K, tokens), each image's own, pooled apart.
    mask = None if sequence is None else naflex.pool_mask(sequence, self.num_prefix_tokens)

    if self.mpp_outputs:  # Each patch's final representation (prefix tokens dropped).
      return nn.Dense(self.mpp_outputs, kernel_init=nn.initializers.zeros,
                      param_dtype=self.param_dtype, name='mpp_head')(
                          x[:, self.num_prefix_tokens:].astype(jnp.float32))
    if self.pool == 'token':  # With a distillation token: both, (batch, 2, D).
      x = x[:, :2] if self.distill_token else x[:, 0]
    elif self.pool == 'gap' and mask is not None:  # The mean of the image's own patches.
      x = naflex.masked_mean(x[:, self.num_prefix_tokens:], mask[..., self.num_prefix_tokens:])
    elif self.pool == 'gap':  # The patches' mean; prefix tokens are not pooled.
      x = jnp.mean(x[:, self.num_prefix_tokens:], axis=1)
    else:
      x = MAPHead(self.block_options, self.map_heads, name='MAPHead_0')(x, mask)
    if self.fc_norm:
      x = self.block_options.norm_layer('fc_norm')(x)

    if self.representation_size is not None:
      x = nn.tanh(nn.Dense(self.representation_size, name='pre_logits', **kw)(x))
    x = x.astype(jnp.float32)
    if not self.num_classes:
      return x.mean(axis=1) if self.distill_token else x
    head = lambda name: nn.Dense(self.num_classes, kernel_init=nn.initializers.zeros,
                                 bias_init=nn.initializers.constant(self.head_bias_init),
                                 param_dtype=self.param_dtype, name=name)
    if self.distill_token:
      logits = head('head')(x[:, 0]), head('head_dist')(x[:, 1])
      return logits if both_heads else (logits[0] + logits[1]) / 2
    return head('head')(x)
