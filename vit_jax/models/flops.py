"""The matmul FLOPs of a ``VisionTransformer``'s forward pass, counted from its shape: what
the MFU of a run (``training.mfu``) and the planner (``tools.aot``) divide by."""

from __future__ import annotations

import flax.linen as nn

from vit_jax.base.sizes import pair


def forward(model: nn.Module, all_tokens: bool = False) -> int | None:
  """Matmul FLOPs of one image's forward pass through ``model`` (a ``VisionTransformer``), 2
  per multiply-add; None for hybrids.

  Per block of T tokens, Q of them queries (T, but ``model.head_tokens`` in the last block),
  width D, MLP width M: 4 T D^2 (k, v) + 4 Q D^2 (q, out) + 4 Q T D (logits, weighted sum)
  + 4 Q D M (MLP; 6 Q D M gated). ``all_tokens=True`` counts Q = T in every block: the count
  that papers and timm publish. Element-wise work (LayerNorm, GELU, softmax) is not counted,
  as in those figures; a training step costs about 3x this. The BiT stem of hybrids is not
  modelled: use XLA's count there.
  """
  if model.resnet_layers is not None:
    return None
  (ph, pw), (gh, gw) = pair(model.patch_size), model.grid
  n, d, m = gh * gw, model.hidden_size, model.mlp_dim
  t = n + model.num_prefix_tokens
  mlp = (6 if model.gated_mlp else 4) * d * m  # Per token.
  block = lambda q: 4 * t * d * d + 4 * q * d * d + 4 * q * t * d + q * mlp
  last = t if all_tokens or model.head_tokens is None else model.head_tokens
  flops = 2 * n * ph * pw * 3 * d  # Patch embedding.
  flops += (model.num_layers - 1) * block(t) + block(last)
  if model.mpp_outputs:  # The per-patch head instead of pooling and classifier.
    return flops + 2 * n * d * model.mpp_outputs
  if model.pool == 'map':  # One probe query over t keys and values, then an MLP.
    flops += 4 * d * d + 4 * t * d * d + 4 * t * d + mlp
  width, heads = d, 1 + int(model.distill_token)  # Each pooled token has its own head.
  if model.representation_size is not None:
    flops += 2 * d * model.representation_size * heads
    width = model.representation_size
  return flops + 2 * width * (model.num_classes or 0) * heads
