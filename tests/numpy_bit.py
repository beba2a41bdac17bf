"""An independent NumPy BiT stem (the hybrids' ResNet) on the flat release layout.

Written from the BiT paper (Kolesnikov et al., 2020) and the release file names only
(float64, no Flax), beside numpy_vit: weight-standardised convolutions (each output
channel's kernel to mean 0, std 1 over its (H, W, in) before use), GroupNorm of 32
groups, ReLU, a 3x3/2 max-pool after the 7x7/2 root, bottleneck units (1x1, 3x3
strided, 1x1 x4 channels, a projected shortcut where a unit changes shape), all with
TensorFlow's 'SAME' padding. ``forward`` runs the stem, then numpy_vit's encoder with
the patch embedding on the stem's feature map.
"""

from __future__ import annotations

import numpy as np

import numpy_vit


def _same_pads(size: int, kernel: int, stride: int) -> tuple[int, int]:
  """TensorFlow's 'SAME': ceil(size / stride) outputs, the odd padding pixel after."""
  out = -(-size // stride)
  total = max((out - 1) * stride + kernel - size, 0)
  return total // 2, total - total // 2


def _windows(x: np.ndarray, kernel: int, stride: int, fill: float) -> tuple[np.ndarray, ...]:
  """x padded 'SAME' and, for each kernel offset (i, j), the strided view it reads."""
  rows, cols = _same_pads(x.shape[1], kernel, stride), _same_pads(x.shape[2], kernel, stride)
  padded = np.pad(x, ((0, 0), rows, cols, (0, 0)), constant_values=fill)
  oh, ow = -(-x.shape[1] // stride), -(-x.shape[2] // stride)
  return tuple(tuple(padded[:, i:i + stride * (oh - 1) + 1:stride,
                            j:j + stride * (ow - 1) + 1:stride] for j in range(kernel))
               for i in range(kernel))


def std_conv(x: np.ndarray, kernel: np.ndarray, stride: int = 1) -> np.ndarray:
  """A weight-standardised convolution: (w - mean) / (std + 1e-5) per output channel."""
  w = kernel - kernel.mean(axis=(0, 1, 2), keepdims=True)
  w = w / (np.sqrt((w**2).mean(axis=(0, 1, 2), keepdims=True)) + 1e-5)
  views = _windows(x, w.shape[0], stride, 0.)
  return sum(np.einsum('bhwc,cd->bhwd', views[i][j], w[i, j])
             for i in range(w.shape[0]) for j in range(w.shape[1]))


def group_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, groups: int = 32,
               eps: float = 1e-6) -> np.ndarray:
  b, h, w, c = x.shape
  g = x.reshape(b, h, w, groups, c // groups)
  mean = g.mean(axis=(1, 2, 4), keepdims=True)
  var = ((g - mean)**2).mean(axis=(1, 2, 4), keepdims=True)
  return ((g - mean) / np.sqrt(var + eps)).reshape(x.shape) * scale + bias


def max_pool(x: np.ndarray, window: int = 3, stride: int = 2) -> np.ndarray:
  views = _windows(x, window, stride, -np.inf)
  return np.max([v for row in views for v in row], axis=0)


def relu(x: np.ndarray) -> np.ndarray:
  return np.maximum(x, 0.)


def stem(p: dict[str, np.ndarray], images: np.ndarray) -> np.ndarray:
  """The BiT stem's feature map of NHWC images, from flat release-layout params."""
  gn = lambda x, name: group_norm(x, p[name + '/scale'], p[name + '/bias'])
  x = std_conv(images.astype(np.float64), p['conv_root/kernel'], 2)
  x = max_pool(relu(gn(x, 'gn_root')))
  stage = 1
  while f'block{stage}/unit1/conv1/kernel' in p:
    unit = 1
    while f'block{stage}/unit{unit}/conv1/kernel' in p:
      u = f'block{stage}/unit{unit}/'
      stride = 2 if stage > 1 and unit == 1 else 1
      residual = x
      if u + 'conv_proj/kernel' in p:
        residual = gn(std_conv(x, p[u + 'conv_proj/kernel'], stride), u + 'gn_proj')
      y = relu(gn(std_conv(x, p[u + 'conv1/kernel']), u + 'gn1'))
      y = relu(gn(std_conv(y, p[u + 'conv2/kernel'], stride), u + 'gn2'))
      y = gn(std_conv(y, p[u + 'conv3/kernel']), u + 'gn3')
      x = relu(residual + y)
      unit += 1
    stage += 1
  return x


def random_hybrid_params(rng: np.random.Generator, *, units: tuple[int, ...], width: int,
                         depth: int, heads: int, mlp: int, grid: tuple[int, int],
                         classes: int) -> dict[str, np.ndarray]:
  """A flat release-layout dict of a hybrid (BiT stem of ``units`` per stage, patch 1).

  The convolution kernels get a mean and a spread that differ per output channel, as
  trained ones do: a convolution without the standardisation gives other outputs.
  """
  p = {k: v for k, v in numpy_vit.random_release_params(
      rng, width=width, depth=depth, heads=heads, mlp=mlp, patch=1, grid=grid,
      classes=classes).items() if k != 'embedding/kernel'}

  def conv(k, cin, cout):
    spread = rng.uniform(0.5, 2., cout)
    offset = rng.normal(0., 1., cout)
    return (rng.standard_normal((k, k, cin, cout)) * spread + offset).astype(np.float32)

  def norm(name, c):
    p[name + '/scale'] = (1 + 0.2 * rng.standard_normal(c)).astype(np.float32)
    p[name + '/bias'] = (0.2 * rng.standard_normal(c)).astype(np.float32)

  p['conv_root/kernel'] = conv(7, 3, 64)
  norm('gn_root', 64)
  cin = 64
  for s, n in enumerate(units):
    features = 64 * 2**s
    for j in range(n):
      u = f'block{s + 1}/unit{j + 1}/'
      if j == 0:
        p[u + 'conv_proj/kernel'] = conv(1, cin, features * 4)
        norm(u + 'gn_proj', features * 4)
      p[u + 'conv1/kernel'] = conv(1, cin, features)
      p[u + 'conv2/kernel'] = conv(3, features, features)
      p[u + 'conv3/kernel'] = conv(1, features, features * 4)
      for k, c in (('gn1', features), ('gn2', features), ('gn3', features * 4)):
        norm(u + k, c)
      cin = features * 4
  p['embedding/kernel'] = (rng.standard_normal((1, 1, cin, width)) / np.sqrt(cin)).astype(
      np.float32)
  return p


def forward(params: dict[str, np.ndarray], images: np.ndarray) -> np.ndarray:
  """Logits of a class-token hybrid ViT: the stem, then numpy_vit on its feature map."""
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  features = stem(p, images)
  encoder = {k: v for k, v in params.items() if not k.startswith(('conv_root', 'gn_root',
                                                                  'block'))}
  return numpy_vit.forward(encoder, features)
