"""The predict and inspect commands, run as a user runs them, on a trained workdir and a .npz."""

import base64
import html
import json
import os
import pathlib
import re
import uuid

import cv2
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.base import errors, paths
from vit_jax.checkpoints.formats import release
from vit_jax.checkpoints.run import workdir
from vit_jax.data import preprocess, sources
from vit_jax.models import get_model
from vit_jax.tools import analysis, inspect, predict

PNG = b'\x89PNG\r\n\x1a\n'
FIGURES = ('embedding_pca', 'position_similarity', 'attention_distance', 'attention_rollout')
# A small model whose shapes match no registry variant: read from the file alone.
NPZ_MODEL = dict(image_size=32, patch_size=8, hidden_size=32, mlp_dim=64, num_heads=4,
                 num_layers=2)
_LINE = re.compile(r'^  (\d)\. +([\d.]+)%  (.+)$')


@pytest.fixture
def run_dir(tiny_run):
  """The shared tiny run (conftest.py): 10 steps of the quickstart recipe, class token."""
  return tiny_run


@pytest.fixture(scope='module')
def digit_files(tmp_path_factory):
  """Three held-out digits as greyscale PNG files, and their arrays."""
  directory = tmp_path_factory.mktemp('digits')
  images = sources.digits('test').images[:3]
  paths = []
  for i, image in enumerate(images):
    paths.append(str(directory / f'digit{i}.png'))
    cv2.imwrite(paths[-1], image[..., 0])
  return paths, images


@pytest.fixture(scope='module')
def npz_file(tmp_path_factory):
  """A release-layout .npz of a tiny 1000-class model (random head), and its params."""
  model = get_model('ti16', num_classes=1000, **NPZ_MODEL)
  shapes = jax.eval_shape(model.init, jax.random.key(0),
                          jax.ShapeDtypeStruct((1, 32, 32, 3), jnp.float32))['params']
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: rng.normal(0., 0.2, s.shape).astype(np.float32), shapes)
  path = tmp_path_factory.mktemp('npz') / 'tiny.npz'
  release.save_npz(path, params)
  return path, model, params


@pytest.fixture(scope='module')
def photo_files(tmp_path_factory):
  """Two colour images of another size than the model's (a PNG and a JPEG)."""
  directory = tmp_path_factory.mktemp('photos')
  rng = np.random.default_rng(1)
  paths = []
  for name in ('a.png', 'b.jpg'):
    paths.append(str(directory / name))
    cv2.imwrite(paths[-1], (rng.random((40, 50, 3)) * 255).astype(np.uint8))
  return paths


def _parse(stdout):
  """The command's output as {file: [(probability %, label), ...]}."""
  results, current = {}, None
  for line in stdout.splitlines():
    if line.startswith('#'):
      continue
    if m := _LINE.match(line):
      results[current].append((float(m.group(2)), m.group(3)))
    else:
      current = line.strip()
      results[current] = []
  return results


def _expected_top5(model, params, inputs, names):
  logits = predict.logits_of(model, params, np.stack(inputs).astype(np.float32))
  indices, values = analysis.top_k(analysis.probabilities(logits, 'softmax'), 5)
  return [[(round(100 * float(v), 2), names[i] if names else f'class {i}')
           for i, v in zip(idx, val, strict=True)]
          for idx, val in zip(indices, values, strict=True)]


def test_predict_on_a_workdir_gives_the_models_top5(run_dir, digit_files, capsys, monkeypatch):
  paths, arrays = digit_files
  monkeypatch.chdir(run_dir.parent)  # The workdir named as from its folder: relative.
  # Batches of 2: the last one is padded; the order must survive.
  assert predict.main(['--workdir', run_dir.name, '--batch_size=2', *paths]) == 0
  results = _parse(capsys.readouterr().out)
  assert list(results) == paths

  loaded = workdir.load_run(run_dir)
  assert loaded.class_names == tuple('0123456789')
  pp = preprocess.parse(loaded.config.dataset.pp_eval)
  inputs = [pp(a, np.random.default_rng(0)) for a in arrays]
  expected = _expected_top5(loaded.model, loaded.params, inputs, loaded.class_names)
  for path, want in zip(paths, expected, strict=True):
    got = results[path]
    assert [label for _, label in got] == [label for _, label in want]
    np.testing.assert_allclose([p for p, _ in got], [p for p, _ in want], atol=0.011)
    assert all(a >= b for (a, _), (b, _) in zip(got, got[1:], strict=False))


def test_predict_on_a_npz_reads_the_architecture_from_the_file(npz_file, photo_files, capsys):
  path, model, params = npz_file
  assert predict.main(['--npz', str(path), *photo_files]) == 0
  captured = capsys.readouterr()
  assert 'width 32, 2 layers, 8x8 patches' in captured.out
  assert 'WordNet ids' in captured.err  # ImageNet's class list, and what it is.
  results = _parse(captured.out)
  assert list(results) == photo_files

  wordnet = predict.imagenet_wordnet_ids()
  assert len(wordnet) == 1000 and wordnet[0] == 'n01440764'
  pp = preprocess.parse('decode|resize(32)|value_range(-1, 1)')
  inputs = [pp(pathlib.Path(p).read_bytes(), None) for p in photo_files]
  expected = _expected_top5(model, params, inputs, wordnet)
  for file, want in zip(photo_files, expected, strict=True):
    assert [label for _, label in results[file]] == [label for _, label in want]
    np.testing.assert_allclose([p for p, _ in results[file]], [p for p, _ in want], atol=0.011)


def test_predict_names_an_unreadable_image_and_goes_on(npz_file, photo_files, tmp_path, capsys):
  bad = tmp_path / 'notes.jpg'
  bad.write_text('these are not pixels')
  missing = tmp_path / 'missing.png'
  code = predict.main(['--npz', str(npz_file[0]), '--batch_size=2', str(bad), photo_files[0],
                       str(missing)])
  captured = capsys.readouterr()
  assert code == errors.EXIT_STATUS
  assert captured.err.splitlines()[1:] == [  # After the note on ImageNet's names.
      f"error: cannot read image {bad}: not an image file OpenCV or Pillow can decode (20 "
      "bytes; it starts b'these are not pi').",
      f'error: cannot read image {missing}: no such file.']
  assert list(_parse(captured.out)) == [photo_files[0]]


def test_predict_errors_name_the_problem(npz_file, photo_files, tmp_path, capsys):
  assert predict.main(['--npz', str(npz_file[0]), '--model=s16', photo_files[0]]) == 2
  err = capsys.readouterr().err
  assert 'does not fit the model ViT-S_16' in err and 'width 32, 2 layers' in err
  assert predict.main(['--workdir', str(tmp_path), photo_files[0]]) == 2
  assert 'is not the workdir of a vit_jax.main run' in capsys.readouterr().err


def test_predict_and_inspect_on_a_non_local_filesystem(npz_file, photo_files, tmp_path, capsys):
  # ram:// is TensorFlow's in-memory filesystem, read through epath's gfile backend as gs://
  # is; os.path, open() and pathlib cannot see it. The same files there give the same output.
  root = paths.path(f'ram://{uuid.uuid4().hex}')
  root.mkdir(parents=True, exist_ok=True)
  names = tmp_path / 'names.txt'
  names.write_text('\n'.join(f'kind {i}' for i in range(1000)))
  local = [str(npz_file[0]), str(names), *photo_files]
  remote = [str(root / pathlib.Path(p).name) for p in local]
  for src, dst in zip(local, remote, strict=True):
    paths.path(dst).write_bytes(pathlib.Path(src).read_bytes())
  assert not any(os.path.exists(p) for p in remote)
  assert predict.main(['--npz', local[0], '--class_names', local[1], *local[2:]]) == 0
  expected = list(_parse(capsys.readouterr().out).values())
  assert predict.main(['--npz', remote[0], '--class_names', remote[1], *remote[2:]]) == 0
  results = _parse(capsys.readouterr().out)
  assert list(results) == remote[2:] and list(results.values()) == expected
  assert expected[0][0][1].startswith('kind ')

  out = root / 'figures'
  assert inspect.main(['--npz', remote[0], '--out', str(out), '--images', *remote[2:]]) == 0
  assert capsys.readouterr().out.split() == [str(out / f'{n}.png') for n in FIGURES] + [
      str(out / 'index.html')]
  assert 'b.jpg' in _check_page(out, FIGURES)

  assert predict.main(['--npz', str(root / 'absent.npz'), remote[2]]) == 2
  assert capsys.readouterr().err.strip().splitlines() == [
      f'error: No checkpoint file at {root}/absent.npz: name a release .npz file (the '
      'docs/checkpoints.md says where to get them).']


def _check_page(out, names):
  page = (out / 'index.html').read_text()
  embedded = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
  assert len(embedded) == len(names)
  assert 'src="http' not in page and 'src="/' not in page  # Self-contained.
  for name, data in zip(names, embedded, strict=True):
    png = (out / f'{name}.png').read_bytes()
    assert png.startswith(PNG) and len(png) > 10_000
    assert base64.b64decode(data) == png
  return page


def test_inspect_a_workdir_on_its_eval_data(run_dir, tmp_path, capsys):
  out = tmp_path / 'figures'
  assert inspect.main(['--workdir', str(run_dir), '--out', str(out), '--num_images=6']) == 0
  written = capsys.readouterr().out.split()
  names = (*FIGURES, 'training_curves')
  assert written == [str(out / f'{n}.png') for n in names] + [str(out / 'index.html')]
  page = _check_page(out, names)
  assert 'averaged over 6 images' in page and 'metrics.jsonl' in page


def test_training_curves_read_a_metrics_file_cut_short_by_a_crash(tmp_path):
  """A run killed mid-write leaves half a line: the curves keep every whole row, the last
  value of a step written twice (a resume), and pass the cut line over."""
  rows = ['{"step": 1, "train/loss": 2.0}', '{"step": 2, "train/loss": 1.5}',
          '{"step": 2, "train/loss": 1.25, "eval/accuracy": 0.5}', '{"step": 3, "train/lo']
  (tmp_path / 'metrics.jsonl').write_text('\n'.join(rows))
  curves = inspect.read_metrics(str(tmp_path))
  assert sorted(curves) == ['eval/accuracy', 'train/loss']
  np.testing.assert_array_equal(curves['train/loss'][0], [1, 2])
  np.testing.assert_array_equal(curves['train/loss'][1], [2.0, 1.25])


@pytest.mark.parametrize('headline, label', [('eval/accuracy', 'accuracy'),
                                              ('eval/prec@1', 'precision@1'),
                                              ('eval/color_accuracy', 'eval/color_accuracy'),
                                              ('few/digits_1shot', 'few/digits_1shot')])
def test_training_curves_plot_the_metric_the_runs_evaluator_names(tmp_path, headline, label):
  """The curve shown is the run's headline metric (``vit_jax.evals.headline``: a sigmoid
  classifier's precision@1, masked patch prediction's colour accuracy, a few-shot table's),
  not eval/accuracy whatever the run logged."""
  rows = [{'step': 1, 'train/loss': 2.0}, {'step': 2, 'train/loss': 1.5, headline: 0.5,
                                            'other/accuracy': 0.9}]
  (tmp_path / 'metrics.jsonl').write_text('\n'.join(json.dumps(r) for r in rows))
  figure = inspect.training_curves_figure(inspect.read_metrics(str(tmp_path)), headline)
  assert f'the held-out {label} at each evaluation' in figure.caption
  assert 'No evaluation' not in figure.caption


def test_inspect_a_npz_on_given_images(npz_file, photo_files, tmp_path, capsys):
  out = tmp_path / 'npz'
  assert inspect.main(['--npz', str(npz_file[0]), '--out', str(out),
                       '--images', *photo_files]) == 0
  page = _check_page(out, FIGURES)
  assert not (out / 'training_curves.png').exists()
  assert 'Predictions (softmax)' in page and 'b.jpg' in page


def test_inspect_errors_name_the_problem(npz_file, tmp_path, capsys):
  assert inspect.main(['--npz', str(npz_file[0]), '--out', str(tmp_path / 'x')]) == 2
  assert 'pass some image files with --images' in capsys.readouterr().err
  bad = tmp_path / 'bad.png'
  bad.write_bytes(PNG + b'truncated')
  assert inspect.main(['--npz', str(npz_file[0]), '--out', str(tmp_path / 'y'),
                       '--images', str(bad)]) == 2
  assert f'cannot read image {bad}' in capsys.readouterr().err


def _colour_mask(png: bytes, rgb: tuple[int, int, int], tolerance: int = 12) -> np.ndarray:
  """The pixels of a PNG within ``tolerance`` of a colour."""
  bgr = cv2.imdecode(np.frombuffer(png, np.uint8), cv2.IMREAD_COLOR)
  return (np.abs(bgr[..., ::-1].astype(int) - rgb) <= tolerance).all(-1)


def test_position_similarity_figure_puts_each_tiles_peak_at_its_own_patch():
  """The figure's pixels, not its file size: a 4x4 grid whose every patch is similar only
  to itself (1 there, -1 elsewhere) must show, in tile (i, j), one bright cell at (i, j)."""
  grid = 4
  own = np.full((grid, grid, grid, grid), -1.)
  for i in range(grid):
    for j in range(grid):
      own[i, j, i, j] = 1.
  yellow, purple = (253, 231, 37), (68, 1, 84)  # viridis at +1 and -1.
  dark = _colour_mask(inspect.position_similarity_figure(np.full_like(own, -1.)).png, purple)
  bright = _colour_mask(inspect.position_similarity_figure(own).png, yellow)
  count, labels, stats, _ = cv2.connectedComponentsWithStats(dark.astype(np.uint8))
  # The 16 tiles are the 16 largest dark regions (white gaps between them; the colour bar's
  # dark end is a thin strip).
  tiles = sorted(stats[1:], key=lambda s: -s[cv2.CC_STAT_AREA])[:grid * grid]
  areas = [s[cv2.CC_STAT_AREA] for s in tiles]
  assert min(areas) > 0.8 * max(areas)
  tiles = sorted(tiles, key=lambda s: (s[cv2.CC_STAT_TOP], s[cv2.CC_STAT_LEFT]))
  for k, s in enumerate(tiles):
    i, j = divmod(k, grid)
    top, left, h, w = (s[cv2.CC_STAT_TOP], s[cv2.CC_STAT_LEFT], s[cv2.CC_STAT_HEIGHT],
                       s[cv2.CC_STAT_WIDTH])
    ys, xs = np.nonzero(bright[top:top + h, left:left + w])
    assert len(ys) > 0.5 * h * w / grid**2, (i, j)  # About one cell of the 16 is bright ...
    assert len(ys) < 1.5 * h * w / grid**2, (i, j)
    assert (int(ys.mean() * grid / h), int(xs.mean() * grid / w)) == (i, j)  # ... at (i, j).


def test_inspect_a_timm_checkpoint_with_registers(photo_files, tmp_path, capsys):
  """--source: timm's reg4 model (registers, no class token, avg pool): its class names, the
  patches' position embeddings, the rollout of the patches it averages."""
  source = pathlib.Path(__file__).resolve().parent / 'data' / 'hub' / 'timm_reg4_gap'
  out = tmp_path / 'reg4'
  assert inspect.main(['--source', str(source), '--out', str(out), '--images', *photo_files]) == 0
  page = _check_page(out, FIGURES)
  assert '4x4 patches + 4 registers' in page and 'goldfish' in page


def test_inspect_a_rotary_checkpoint_without_position_embeddings(photo_files, tmp_path):
  """--source: timm's DINOv3 (a rotary encoding alone): every figure but the position
  embeddings' similarity, which it has none of, said in one note."""
  source = pathlib.Path(__file__).resolve().parent / 'data' / 'hub' / 'timm_dinov3'
  out = tmp_path / 'dinov3'
  assert inspect.main(['--source', str(source), '--out', str(out), '--images', *photo_files]) == 0
  page = _check_page(out, tuple(f for f in FIGURES if f != 'position_similarity'))
  assert html.escape("No position embeddings (a rotary encoding alone, rope='dinov3')") in page


@pytest.mark.slow  # A compile of the attention-capturing model.
def test_inspect_a_naflex_folder_on_images_at_its_tables_size(tmp_path, capsys):
  """A SigLIP 2 NaFlex folder (one grid per image would make no figure) is inspected on the
  images resized to its position table's input, with its own resize and scaling, saying so."""
  data = pathlib.Path(__file__).resolve().parent / 'data'
  out = tmp_path / 'naflex'
  images = [str(data / 'preprocess' / 'images' / f'{n}.png') for n in ('wide', 'tall')]
  assert inspect.main([f'--source={data / "hub" / "hf_siglip2_cls"}', '--out', str(out),
                       '--images', *images]) == 0
  page = _check_page(out, FIGURES)
  assert 'A NaFlex checkpoint' in page and html.escape(
      "decode|resize(32, 'pil_bilinear')|value_range(-1, 1)") in page
