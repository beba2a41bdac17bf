r"""Look inside a trained ViT: the paper's section 4.5 figures and one HTML page.

    python -m vit_jax.tools.inspect --workdir=/tmp/q --out=/tmp/q/inspect
    python -m vit_jax.tools.inspect --npz=ViT-B_16.npz --out=/tmp/b16 --images cat.jpg dog.jpg
    python -m vit_jax.tools.inspect --source=hf-hub:timm/deit3_base_patch16_224.fb_in1k \
        --out=/tmp/deit3 --images cat.jpg

Writes into ``--out`` the patch-embedding PCA, the position embeddings' similarity, the mean
attention distance per head, attention rollout on images (``--images``, or ``--num_images`` of a
workdir's evaluation split) and a workdir's training curves, as PNG files, and ``index.html``,
which embeds them all in one file. The arrays come from ``vit_jax.tools.analysis``.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import html
import sys
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from etils import epath

from vit_jax.base import errors, paths
from vit_jax.base.sizes import pair
from vit_jax.checkpoints.run import record
from vit_jax.data import preprocess, sources
from vit_jax.tools import predict

if TYPE_CHECKING:  # jax and flax load after the command line is checked.
  from vit_jax.models import VisionTransformer

CHARS_PER_INCH = 12  # Of a 9 pt caption, for wrapping.
MAX_PNG_BYTES = 300_000


@dataclasses.dataclass
class Figure:
  name: str
  title: str
  caption: str
  png: bytes


@dataclasses.dataclass
class Images:
  """The images the attention figures are computed on."""

  inputs: np.ndarray  # (N, H, W, 3) float32, as the model sees them.
  pixels: np.ndarray  # (N, H, W, 3) uint8, the same crops for display.
  names: list[str]
  labels: list[str | None]  # The true class, when known.
  origin: str


# ---------------------------------------------------------------------------
# Figures (matplotlib, Agg).


def _new_figure(width: float, height: float, caption: str):
  """A figure with ``height`` inches of content above a wrapped caption.

  Returns (figure, content): draw into ``content`` (a subfigure, laid out on its own,
  so that axis labels never run into the caption).
  """
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  lines = textwrap.wrap(caption, width=int(width * CHARS_PER_INCH))
  strip = 0.15 + 0.16 * len(lines)  # Inches below the content for the caption.
  fig = plt.figure(figsize=(width, height + strip), layout='constrained')
  content, below = fig.subfigures(2, 1, height_ratios=(height, strip))
  below.text(0.5, 0.5, '\n'.join(lines), ha='center', va='center', fontsize=9,
             color='#333333')
  return fig, content


def _render(fig, content, name: str, title: str, caption: str) -> Figure:
  import io

  import matplotlib.pyplot as plt

  content.suptitle(title, fontweight='bold')
  buffer = io.BytesIO()
  fig.savefig(buffer, format='png', dpi=100)
  plt.close(fig)
  png = buffer.getvalue()
  if len(png) > MAX_PNG_BYTES:  # Photographs: a 256-colour palette keeps the page light.
    from PIL import Image

    buffer = io.BytesIO()
    with Image.open(io.BytesIO(png)) as image:
      image.convert('RGB').quantize(256, method=Image.Quantize.FASTOCTREE).save(
          buffer, format='PNG', optimize=True)
    png = buffer.getvalue()
  return Figure(name, title, caption, png)


def _normalise(x: np.ndarray) -> np.ndarray:
  lo, hi = float(np.min(x)), float(np.max(x))
  return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x) + 0.5


def embedding_pca_figure(components: np.ndarray, ratio: np.ndarray) -> Figure:
  """Tiles of the first principal components of the patch-embedding filters
  (``analysis.embedding_pca``: the components, the share of the variance each explains).

  One image (a mosaic of enlarged tiles), not one axes per tile: it renders in a
  fraction of the time.
  """
  n, ph, pw, channels = components.shape
  cols = min(7, n)
  rows = -(-n // cols)
  scale = max(1, 48 // max(ph, pw))  # Tiles about 48 screen pixels wide.
  th, tw, gap, label = ph * scale, pw * scale, max(2, scale), 14
  mosaic = np.ones((rows * (th + gap + label), cols * (tw + gap) - gap, 3))
  for i, component in enumerate(components):
    tile = _normalise(component)
    tile = np.repeat(np.repeat(tile, scale, axis=0), scale, axis=1)
    top = (i // cols) * (th + gap + label) + label
    left = (i % cols) * (tw + gap)
    mosaic[top:top + th, left:left + tw] = tile if channels == 3 else tile[..., :1]
  caption = ('Each tile is one principal component of the patch-embedding filters (the '
             'linear map of raw RGB patches to tokens), contrast-stretched; above it, the '
             'share of the filters\' variance it explains. Smooth blobs, edges and colour '
             'contrasts are basis functions like a CNN\'s first layer (paper, figure 7, left).')
  fig, sub = _new_figure(max(5.5, mosaic.shape[1] / 55 + 1.), mosaic.shape[0] / 55 + 0.6, caption)
  ax = sub.add_subplot()
  ax.imshow(mosaic, interpolation='nearest')
  for i in range(n):
    ax.text((i % cols) * (tw + gap) + tw / 2, (i // cols) * (th + gap + label) + label - 3,
            f'{i + 1}: {100 * ratio[i]:.1f}%', ha='center', va='bottom', fontsize=7)
  ax.set(xticks=[], yticks=[])
  ax.spines[:].set_visible(False)
  ax.set_xlabel(f'components 1-{n}, left to right, then down; each tile a {ph}x{pw}-pixel '
                'patch', fontsize=9)
  return _render(fig, sub, 'embedding_pca', f'Patch-embedding filters: the first {n} principal '
                 'components', caption)


def position_similarity_figure(similarity: np.ndarray, fixed: bool = False) -> Figure:
  """The (rows, cols, rows, cols) similarity as one mosaic of small maps."""
  gh, gw = similarity.shape[:2]
  mosaic = np.full((gh * (gh + 1) - 1, gw * (gw + 1) - 1), np.nan)
  for i in range(gh):
    for j in range(gw):
      mosaic[i * (gh + 1):i * (gh + 1) + gh, j * (gw + 1):j * (gw + 1) + gw] = similarity[i, j]
  kind = 'the fixed 2-D sin-cos' if fixed else 'the learned'
  caption = (f'Tile (row, column) maps the cosine similarity of that patch\'s position '
             f'embedding ({kind} one) to those of all patches. A peak at the tile\'s own place '
             'fading with distance, with row and column stripes, means the embeddings encode '
             'the 2-D image grid (paper, figure 7, centre).')
  side = min(9., max(5., 0.45 * max(gh, gw) + 3.))
  fig, sub = _new_figure(side + 1., side, caption)
  ax = sub.add_subplot()
  import matplotlib

  cmap = matplotlib.colormaps['viridis'].with_extremes(bad='white')
  image = ax.imshow(mosaic, cmap=cmap, vmin=-1, vmax=1, interpolation='nearest')
  step = max(1, -(-max(gh, gw) // 16))  # At most ~16 tick labels per axis.
  for set_ticks, n in ((ax.set_xticks, gw), (ax.set_yticks, gh)):
    set_ticks([k * (n + 1) + (n - 1) / 2 for k in range(0, n, step)],
              [str(k + 1) for k in range(0, n, step)])
  ax.tick_params(length=0)
  ax.spines[:].set_visible(False)
  ax.set_xlabel('input patch column')
  ax.set_ylabel('input patch row')
  sub.colorbar(image, ax=ax, shrink=0.8, label='cosine similarity')
  return _render(fig, sub, 'position_similarity',
                 f'Position-embedding similarity ({gh}x{gw} patches)', caption)


def attention_distance_figure(distances: np.ndarray, reference: float, num_images: int,
                              spacing: tuple[float, float]) -> Figure:
  """Mean attention distance of every head (dots) against layer depth."""
  import matplotlib

  layers, heads = distances.shape
  caption = (f'Each dot is one head: the distance in input pixels from a query patch to the '
             f'patches it attends to, weighted by attention and averaged over {num_images} '
             'images. Low values are local attention, as in a convolution; values near the '
             'dashed line, attention spread over the whole image (paper, figure 7, right).')
  fig, sub = _new_figure(7., 4.3, caption)
  ax = sub.add_subplot()
  colours = matplotlib.colormaps['tab20' if heads > 10 else 'tab10']
  jitter = np.linspace(-0.15, 0.15, heads) if heads > 1 else np.zeros(1)
  depth = np.arange(1, layers + 1)
  for h in range(heads):
    ax.scatter(depth + jitter[h], distances[:, h], s=22, color=colours(h % colours.N),
               label=f'head {h + 1}', edgecolors='none', alpha=0.9)
  ax.axhline(reference, color='gray', linestyle='--', linewidth=1)
  ax.annotate('uniform attention over the image', (0.55, reference), xytext=(0, 3),
              textcoords='offset points', fontsize=8, color='gray', va='bottom')
  ax.set_xlim(0.4, layers + 0.6)
  ax.set_ylim(0, max(reference, float(distances.max())) * 1.12)
  ax.set_xticks(depth if layers <= 24 else depth[::2])
  ax.set_xlabel('network depth (layer)')
  ax.set_ylabel('mean attention distance (pixels)')
  ax.grid(alpha=0.3)
  if heads <= 16:
    ax.legend(fontsize=7, ncol=2 if heads > 6 else 1, loc='lower right', framealpha=0.8)
  dy, dx = spacing
  spacing_text = f'{dx:g} px' if dx == dy else f'{dy:g} x {dx:g} px'
  return _render(fig, sub, 'attention_distance',
                 f'Mean attention distance per head (tokens {spacing_text} apart)', caption)


def attention_rollout_figure(images: Images, maps: np.ndarray, predictions: list[str],
                             show: int) -> Figure:
  """Input, rollout heat map and rollout-masked input for the first ``show`` images."""
  import cv2

  n = min(show, len(images.pixels))
  caption = ('Attention rollout (Abnar & Zuidema, 2020): the attention of all layers, heads '
             'averaged and the residual added, multiplied through the network, read at the '
             'token the classifier uses. Bright patches are the ones the prediction draws on; '
             'the heat map spans each map\'s minimum to maximum, the bottom row scales the '
             'input by map / maximum (paper, figure 6). Titles: the top prediction and its '
             'probability (and the true class, green when they agree).')
  fig, sub = _new_figure(max(2.0 * n, 6.), 6.4, caption)
  axes = sub.subplots(3, n, squeeze=False)
  for k in range(n):
    pixels = images.pixels[k]
    h, w = pixels.shape[:2]
    heat = cv2.resize(np.asarray(maps[k], np.float32), (w, h), interpolation=cv2.INTER_LINEAR)
    heat = np.clip(heat, 0., 1.)
    interpolation = 'nearest' if max(h, w) < 64 else 'antialiased'
    axes[0, k].imshow(pixels, interpolation=interpolation)
    axes[1, k].imshow(pixels, interpolation=interpolation)
    axes[1, k].imshow(heat, cmap='inferno', alpha=0.6, vmin=float(heat.min()), vmax=1.,
                      interpolation='bilinear')
    axes[2, k].imshow((pixels * heat[..., None]).astype(np.uint8), interpolation=interpolation)
    predicted, true = predictions[k], images.labels[k]
    lines = [textwrap.shorten(predicted, 30, placeholder='...')]
    colour = 'black'
    if true is not None:
      lines.append(textwrap.shorten(f'true: {true}', 30, placeholder='...'))
      colour = 'tab:green' if predicted.rsplit(' ', 1)[0] == true else 'tab:red'
    axes[0, k].set_title('\n'.join(lines), fontsize=7.5, color=colour)
    for ax in axes[:, k]:
      ax.set(xticks=[], yticks=[])
  for row, label in enumerate(('input', 'rollout on input', 'input x rollout')):
    axes[row, 0].set_ylabel(label, fontsize=9)
  sub.supxlabel(f'images ({images.origin})', fontsize=9)
  return _render(fig, sub, 'attention_rollout', 'Attention rollout: where the prediction looks',
                 caption)


def read_metrics(workdir: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """metrics.jsonl -> {name: (steps, values)}; a resumed run's repeated steps keep the last."""
  series: dict[str, dict[int, float]] = {}
  for _, row in record.metric_rows(workdir):
    step = int(row.pop('step'))
    for key, value in row.items():
      series.setdefault(key, {})[step] = float(value)
  return {k: (np.array(sorted(v)), np.array([v[s] for s in sorted(v)])) for k, v in series.items()}


def training_curves_figure(metrics: dict[str, tuple[np.ndarray, np.ndarray]], headline: str,
                           last_step: int | None = None) -> Figure:
  """Loss, learning rate and the run's headline metric (``headline``, 'NAME/METRIC' as
  ``vit_jax.evals.headline`` names it: 'eval/accuracy', 'eval/prec@1', 'few/cars196_5shot')
  against the step, one panel each.

  With ``last_step``, only the steps up to it: the run as far as the inspected
  checkpoint.
  """
  if last_step is not None:
    metrics = {k: (steps[steps <= last_step], values[steps <= last_step])
               for k, (steps, values) in metrics.items()}
    metrics = {k: v for k, v in metrics.items() if len(v[0])}
  accuracy = headline if headline in metrics else None
  label = {'accuracy': 'accuracy', 'prec@1': 'precision@1'}.get(
      headline.rsplit('/', 1)[-1], headline)
  texts = {  # Each panel shown: what its caption says of it.
      'loss': ('train/loss' in metrics or 'eval/loss' in metrics) and (
          'the training loss (the mean over the logged step\'s batch)'
          + (' and the held-out loss' if 'eval/loss' in metrics else '')),
      'learning rate': 'train/learning_rate' in metrics and 'the learning-rate schedule',
      'accuracy': accuracy and f'the held-out {label} at each evaluation'}
  panels = [panel for panel, text in texts.items() if text]
  if not panels:
    raise ValueError(f'metrics.jsonl has no train/loss, train/learning_rate or {headline}.')
  shown = [texts[panel] for panel in panels]
  listing = shown[0] if len(shown) == 1 else ', '.join(shown[:-1]) + '; and ' + shown[-1]
  caption = f'From the run\'s metrics.jsonl: {listing}.'
  if not accuracy:
    caption += ' No evaluation was logged in these steps.'
  fig, sub = _new_figure(4.2 * len(panels), 3.6, caption)
  axes = sub.subplots(1, len(panels), squeeze=False)[0]
  for ax, panel in zip(axes, panels, strict=True):
    if panel == 'loss':
      for key, label, style in (('train/loss', 'train', '-'), ('eval/loss', 'held out', 'o-')):
        if key in metrics:
          ax.plot(*metrics[key], style, label=label, markersize=4)
      values = np.concatenate([metrics[k][1] for k in ('train/loss', 'eval/loss')
                               if k in metrics])
      if values.min() > 0 and values.max() / values.min() > 30:
        ax.set_yscale('log')
      ax.set_ylabel('cross-entropy loss' + (' (log scale)' if ax.get_yscale() == 'log' else ''))
      ax.legend(fontsize=8)
    elif panel == 'learning rate':
      ax.plot(*metrics['train/learning_rate'])
      ax.set_ylabel('learning rate')
      ax.ticklabel_format(axis='y', style='sci', scilimits=(-2, 2))
    else:
      steps, values = metrics[accuracy]
      ax.plot(steps, 100 * values, 'o-', markersize=4)
      ax.set_ylabel(f'{label} (%, held out)')
      ax.annotate(f'{100 * values[-1]:.1f}%', (steps[-1], 100 * values[-1]),
                  xytext=(-4, -12), textcoords='offset points', ha='right', fontsize=8)
    ax.set_title(label if panel == 'accuracy' else panel, fontsize=10)
    ax.set_xlabel('training step')
    ax.grid(alpha=0.3)
  title = 'Training curves' + (f' up to step {last_step}' if last_step is not None else '')
  return _render(fig, sub, 'training_curves', title, caption)


# ---------------------------------------------------------------------------
# Inputs and the attention pass.


def user_images(source: predict.Source, files: Sequence[str]) -> Images:
  """The given files, preprocessed as the model expects."""
  prep, show = predict.preprocess_fn(source), predict.preprocess_fn(source, display=True)
  inputs, pixels = [], []
  for path in files:
    inputs.append(predict.load_file(path, prep))
    pixels.append(show(predict.read_image(path)))
  return Images(np.stack(inputs).astype(np.float32), np.stack(pixels).astype(np.uint8),
                [paths.path(p).name for p in files], [None] * len(files), 'the given files')


def eval_images(source: predict.Source, workdir: str, count: int) -> Images:
  """``count`` examples spread evenly over the run's evaluation split."""
  dataset = source.loaded.config.dataset
  split = dataset.get('eval_split', 'test')
  try:
    data = sources.get_source(dataset, split)
  except Exception as e:  # Whatever keeps the data from opening, the way out is --images.
    raise FileNotFoundError(
        f'No --images given and the evaluation data of {workdir} (dataset '
        f'{dataset.get("name")!r}, split {split!r}) cannot be opened here ({e}). '
        'Pass some image files with --images.') from None
  if len(data) == 0:
    raise ValueError(f'The {split!r} split of {workdir} is empty. Pass --images.')
  indices = np.unique(np.linspace(0, len(data) - 1, min(count, len(data))).astype(int))
  prep, show = predict.preprocess_fn(source), predict.preprocess_fn(source, display=True)
  inputs, pixels, labels = [], [], []
  for i in indices:
    example = data[int(i)]
    inputs.append(prep(example['image']))
    pixels.append(show(example['image']))
    label = np.asarray(example['label'])
    labels.append(source.label(int(label)) if label.ndim == 0 else None)
  return Images(np.stack(inputs).astype(np.float32), np.stack(pixels).astype(np.uint8),
                [f'{split}[{i}]' for i in indices], labels,
                f'{len(indices)} from the {split!r} split')


def attention_pass(summary: Any, model: VisionTransformer, params: Any, inputs: np.ndarray,
                   batch_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Logits, attention distance per image (N, layers, heads) and rollout maps (N, rows, cols):
  ``summary`` (``analysis.attention_summary``) of ``model`` (capturing its attention weights)
  on batches of ``inputs``."""
  import jax

  params = jax.device_put(params)
  size = max(1, min(batch_size, len(inputs)))
  outputs = []
  for chunk in predict.batches(inputs, size):
    result = predict.jitted(summary)(model, params, predict.padded(list(chunk), size))
    outputs.append([np.asarray(r)[:len(chunk)] for r in result])
  return tuple(np.concatenate(parts) for parts in zip(*outputs, strict=True))


# ---------------------------------------------------------------------------
# The page.


def write_html(path: epath.Path, source: predict.Source, figures: list[Figure],
               notes: list[str], predictions: list[tuple[str, list[tuple[str, float]]]]) -> None:
  """One self-contained page: the figures as base64 PNGs, their captions, the predictions."""
  import jax

  model = source.model
  n_params = sum(int(np.size(x)) for x in jax.tree.leaves(source.params))
  h, w = pair(model.image_size)
  rows = [('model', model.model_name), ('parameters from', source.loaded.source),
          ('parameters', f'{n_params:,}'), ('input', f'{h}x{w} pixels, "{source.pp_spec}"'),
          ('tokens', f'{model.grid[0]}x{model.grid[1]} patches'
                     + (' + class token' if model.has_class_token else '')
                     + (f' + {model.num_registers} registers' if model.num_registers else '')),
          ('layers x heads', f'{model.num_layers} x {model.num_heads}, width '
                             f'{model.hidden_size}')]
  e = html.escape
  parts = ['<!doctype html><html><head><meta charset="utf-8">',
           f'<title>Inside {e(model.model_name or "ViT")}</title>',
           '<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}'
           'img{max-width:100%;border:1px solid #ddd}td,th{padding:2px 10px;text-align:left}'
           '.caption{color:#444;font-size:0.95em}.note{color:#a50}</style></head><body>',
           f'<h1>Inside {e(model.model_name or "ViT")}</h1><table>']
  parts += [f'<tr><th>{e(k)}</th><td>{e(str(v))}</td></tr>' for k, v in rows]
  parts.append('</table>')
  parts += [f'<p class="note">{e(note)}</p>' for note in notes]
  for fig in figures:
    data = base64.b64encode(fig.png).decode('ascii')
    parts += [f'<h2 id="{fig.name}">{e(fig.title)}</h2>',
              f'<img src="data:image/png;base64,{data}" alt="{e(fig.title)}">',
              f'<p class="caption">{e(fig.caption)}</p>']
  if predictions:
    parts.append(f'<h2 id="predictions">Predictions ({e(source.activation)})</h2><table>')
    parts.append('<tr><th>image</th><th>top classes</th></tr>')
    for name, top in predictions:
      cells = ', '.join(f'{e(label)} {100 * p:.1f}%' for label, p in top)
      parts.append(f'<tr><td>{e(name)}</td><td>{cells}</td></tr>')
    parts.append('</table>')
  parts.append('</body></html>')
  path.write_text('\n'.join(parts))


def inspect(args: argparse.Namespace) -> list[epath.Path]:
  """Computes the analyses, writes the PNGs and index.html; returns their paths."""
  predict.resolve_source_flags(args)
  if not args.images and not args.workdir:
    what = 'checkpoint other than a workdir' if args.source else '.npz file'
    raise ValueError(f'A {what} comes without data: pass some image files with --images.')
  source = predict.load_source(args)
  from vit_jax.tools import analysis  # After load_source: jax is there already.

  model = source.model
  notes = list(source.notes)
  if preprocess.parse(source.pp_spec).patches:  # Its figures need one grid for every image.
    spec = dataclasses.replace(source.loaded.preprocessing or preprocess.EvalSpec(),
                               resize='exact')
    source = dataclasses.replace(source, pp_spec=spec.spec(pair(model.image_size)))
    notes.append('A NaFlex checkpoint (patch sequences, each image at its own aspect ratio): '
                 f'inspected on images resized to its position table\'s input, '
                 f'"{source.pp_spec}", so that every image has one grid; its predictions '
                 'here are of those, not of its own patch sequences (vit_jax.tools.predict).')
  images = (user_images(source, args.images) if args.images else
            eval_images(source, args.workdir, args.num_images))

  figures = []
  params = source.params
  if model.resnet_layers is None:
    figures.append(embedding_pca_figure(*analysis.embedding_pca(
        np.asarray(params['embedding']['kernel']), args.components)))
  else:
    notes.append('A hybrid\'s patch embedding acts on ResNet features, not pixels: no '
                 'filter figure.')
  if model.posemb == 'none':
    notes.append(f'No position embeddings (a rotary encoding alone, rope={model.rope!r}): no '
                 'similarity figure.')
  else:
    similarity = analysis.position_similarity(analysis.position_embeddings(model, params),
                                              model.grid)
    figures.append(position_similarity_figure(similarity, fixed=model.posemb == 'sincos2d'))

  logits, distances, maps = attention_pass(analysis.attention_summary,
                                           analysis.capturing_model(model), params,
                                           images.inputs, args.batch_size)
  spacing = analysis.token_spacing(model)
  figures.append(attention_distance_figure(
      distances.mean(axis=0), analysis.uniform_distance(model.grid, spacing),
      len(images.inputs), spacing))
  top = []
  if model.num_classes:
    indices, values = analysis.top_k(analysis.probabilities(logits, source.activation), 5)
    top = [[(source.label(int(i)), float(v)) for i, v in zip(idx, val, strict=True)]
           for idx, val in zip(indices, values, strict=True)]
  titles = [f'{t[0][0]} {100 * t[0][1]:.0f}%' if t else name
            for t, name in zip(top or [None] * len(images.names), images.names, strict=True)]
  if model.pool == 'map':
    notes.append('pool="map": the rollout is read as the mean over all tokens, an '
                 'approximation of what the attention-pooling head reads.')
  figures.append(attention_rollout_figure(images, maps, titles, args.show))

  if args.workdir:
    metrics = paths.path(args.workdir) / record.METRICS_FILE
    if metrics.is_file():
      step = record.resolve_step(args.workdir, args.step)
      from vit_jax import evals  # The run's headline metric, as its evaluator names it.

      headline = evals.headline(record.load_config(args.workdir))
      figures.append(training_curves_figure(read_metrics(args.workdir), headline, step))
    else:
      notes.append(f'{metrics} does not exist: no training curves.')

  out = paths.path(args.out)  # Local or remote (gs://).
  out.mkdir(parents=True, exist_ok=True)
  written = [out / f'{fig.name}.png' for fig in figures]
  for path, fig in zip(written, figures, strict=True):
    path.write_bytes(fig.png)
  page = out / 'index.html'
  write_html(page, source, figures, notes,
             list(zip(images.names, top, strict=True)) if args.images and top else [])
  written.append(page)
  return written


def main(argv: Sequence[str] | None = None) -> int:
  parser = errors.ArgumentParser(prog='python -m vit_jax.tools.inspect', description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  predict.add_source_flags(parser)
  parser.add_argument('--out', required=True, type=paths.expand,
                      help='directory for the PNGs and index.html')
  parser.add_argument('--images', nargs='*', default=[], type=paths.expand,
                      help='image files for the attention figures')
  parser.add_argument('--num_images', type=int, default=32,
                      help='workdir without --images: examples taken from its eval split')
  parser.add_argument('--show', type=int, default=8, help='images in the rollout figure')
  parser.add_argument('--components', type=int, default=28,
                      help='principal components of the embedding filters shown')
  args = parser.parse_args(argv)

  try:
    predict.check_source_paths(args)
    paths.input_files(args.images)
    paths.output_dir(args.out, 'out')
    written = inspect(args)
  except (errors.UserError, FileNotFoundError, ValueError) as e:
    return errors.report(e)  # One line, exit status 2, as every entry point.
  for path in written:
    print(path)
  return 0


if __name__ == '__main__':
  sys.exit(main())
