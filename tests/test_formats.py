"""vit_jax.checkpoints.formats (and vit_jax.checkpoints.load / export): one SOURCE string for
every checkpoint, recognised by what is there; the hf-hub: path through huggingface_hub's
own cache, offline."""

import json
import pathlib
import shutil
import subprocess
import sys

import chex
import jax
import numpy as np
import pytest
import scipy.ndimage

from vit_jax import checkpoints
from vit_jax.base import errors
from vit_jax.checkpoints import formats
from vit_jax.checkpoints.formats import fit, hub, layout, release
from vit_jax.data import preprocess
from vit_jax.models import get_model

from runs import ROOT, env, hub_cache

HUB = pathlib.Path(__file__).resolve().parent / 'data' / 'hub'


@pytest.fixture(scope='module')
def sources(tmp_path_factory):
  """One checkpoint of each kind (a release .npz file, a folder laid out as a run's workdir)."""
  root = tmp_path_factory.mktemp('sources')
  model = get_model('ti16', num_classes=3, hidden_size=32, mlp_dim=64, num_heads=2,
                    num_layers=2, patch_size=8, image_size=32)
  params = jax.eval_shape(model.init, jax.random.key(0), np.zeros((1, 32, 32, 3)))['params']
  release.save_npz(root / 'model.npz', jax.tree.map(lambda x: np.ones(x.shape, x.dtype), params))
  (root / 'run' / 'checkpoints').mkdir(parents=True)
  (root / 'empty').mkdir()
  (root / 'file.txt').write_text('')
  both = root / 'both'
  shutil.copytree(HUB / 'timm_augreg', both)
  shutil.copy(HUB / 'bv_tok' / 'checkpoint.bv-LAST', both)
  (both / 'checkpoint.bv-000000003').mkdir()
  return {'npz': str(root / 'model.npz'), 'workdir': str(root / 'run'),
          'timm': str(HUB / 'timm_deit3'), 'transformers': str(HUB / 'hf_vit_model'),
          'big_vision': str(HUB / 'bv_tok'),
          'big_vision step': str(HUB / 'bv_tok' / 'checkpoint.bv-000000003'),
          'hf-hub': 'hf-hub:org/name', 'empty': str(root / 'empty'),
          'file': str(root / 'file.txt'), 'both': str(both), 'missing': str(root / 'nope')}


@pytest.mark.parametrize('kind', ['npz', 'workdir', 'timm', 'transformers', 'big_vision',
                                  'big_vision step', 'hf-hub'])
def test_each_source_is_recognised_by_what_is_there(sources, kind):
  assert formats.origin(sources[kind]) == kind.split()[0]


@pytest.mark.parametrize('kind, error, message', [
    ('empty', errors.CheckpointError, 'is not a checkpoint vit_jax reads: name a release'),
    ('file', errors.CheckpointError, 'is a file but not a .npz checkpoint'),
    ('missing', errors.MissingFileError, 'does not exist: name a release or big_vision .npz'),
    ('both', errors.CheckpointError, 'is both a timm and a big_vision checkpoint'),
])
def test_anything_else_is_one_line_naming_what_is_accepted(sources, kind, error, message):
  with pytest.raises(error) as e:
    formats.origin(sources[kind])
  assert message in str(e.value) and '\n' not in str(e.value)
  with pytest.raises(errors.CheckpointError, match='folder that holds it'):
    formats.origin(str(HUB / 'timm_augreg' / 'model.safetensors'))


def test_one_load_for_every_source(sources):
  """checkpoints.load: the model and parameters, whatever the source."""
  npz = checkpoints.load(sources['npz'])
  chex.assert_trees_all_equal(layout.flatten(npz.params),
                              layout.flatten(release.load_npz(sources['npz'])))
  timm = checkpoints.load(sources['timm'])
  assert timm.model.layer_scale == 1e-6 and timm.source.endswith('(timm)')
  bv = checkpoints.load(sources['big_vision'], image_size=(16, 24), source_grid=(4, 6))
  assert bv.model.representation_size == 8
  with pytest.raises(errors.ConfigError, match="model_name='b16' is given, but .* config.json"):
    checkpoints.load(sources['timm'], model_name='b16')
  with pytest.raises(errors.ConfigError, match='A step is given, but .* holds one set'):
    checkpoints.load(sources['timm'], step=3)
  with pytest.raises(errors.ConfigError, match='ema=True, but .* is not a workdir'):
    checkpoints.load(sources['npz'], ema=True)
  with pytest.raises(errors.ConfigError, match='image_size given, but .* is a workdir'):
    checkpoints.load(sources['workdir'], image_size=64)


def test_a_hub_folder_at_another_size_has_its_position_embeddings_resized():
  loaded = checkpoints.load(str(HUB / 'timm_deit3'))
  bigger = checkpoints.load(str(HUB / 'timm_deit3'), image_size=48)
  assert bigger.model.grid == (12, 12) and not bigger.model.prefix_posemb
  posemb = lambda p: p['Transformer']['posembed_input']['pos_embedding']
  # The releases' resize, computed apart: scipy.ndimage.zoom, order 1 (corners aligned), of
  # the 8x8 grid (deit3: no class-token row).
  grid = np.asarray(posemb(loaded.params))[0].reshape(8, 8, -1).astype(np.float64)
  expected = scipy.ndimage.zoom(grid, (1.5, 1.5, 1), order=1).reshape(1, 144, -1)
  chex.assert_trees_all_close(posemb(bigger.params), expected.astype(np.float32), rtol=1e-6,
                              atol=1e-6)
  # By hand: a 2x2 grid [[a, b], [c, d]] to 3x3 puts the means between the corners.
  x = np.array([1., 2., 4., 8.]).reshape(1, 4, 1)
  chex.assert_trees_all_close(fit.resize_posemb(x, (3, 3), (2, 2), 0).ravel(),
                              np.array([1, 1.5, 2, 2.5, 3.75, 5, 4, 6, 8]))
  chex.assert_trees_all_equal(bigger.params['cls'], loaded.params['cls'])


def test_hf_hub_ids_load_offline_from_the_client_cache(offline_hub):
  offline_hub('test-org/tiny-deit3', HUB / 'timm_deit3')
  loaded = checkpoints.load('hf-hub:test-org/tiny-deit3')
  local = checkpoints.load(str(HUB / 'timm_deit3'))
  chex.assert_trees_all_equal(loaded.params, local.params)
  assert loaded.model == local.model and loaded.source == 'hf-hub:test-org/tiny-deit3 (timm)'
  assert formats.local_folder('hf-hub:test-org/tiny-deit3@main').endswith(
      'snapshots/0123456789abcdef0123456789abcdef01234567')
  with pytest.raises(errors.MissingFileError, match='hf-hub:test-org/absent is not in the '
                     r'Hugging Face cache \(.*hf_home/hub\)'):
    checkpoints.load('hf-hub:test-org/absent')
  with pytest.raises(errors.ConfigError, match='not a Hub id: write hf-hub:ORG/NAME'):
    checkpoints.load('hf-hub:no-slash')


def test_predict_takes_an_hf_hub_source_from_the_environment(tmp_path):
  """The command line as users run it: HF_HOME names the cache, HF_HUB_OFFLINE=1."""
  from PIL import Image

  hub_cache(tmp_path / 'home' / 'hub', 'test-org/tiny-vit', HUB / 'hf_vit_cls_tanh')
  image = tmp_path / 'image.png'
  Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 50, 3), np.uint8)).save(image)
  command = [sys.executable, '-m', 'vit_jax.tools.predict', '--source=hf-hub:test-org/tiny-vit',
             '--top=2', str(image)]
  run_env = {**env(devices=1), 'HF_HOME': str(tmp_path / 'home'), 'HF_HUB_OFFLINE': '1',
             'PYTHONPATH': str(ROOT)}
  result = subprocess.run(command, env=run_env, capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
  assert result.returncode == 0, result.stderr[-3000:]
  # No preprocessor_config.json: ViTImageProcessor's defaults, PIL's bilinear resize.
  assert ('from hf-hub:test-org/tiny-vit (transformers); 32x32 input ("decode|resize(32, '
          "'pil_bilinear')|value_range(-1, 1)\")") in result.stdout
  labels = {'tench', 'goldfish', 'great white shark', 'tiger shark', 'hammerhead'}
  ranked = [line.split('%  ')[1] for line in result.stdout.splitlines() if '%  ' in line]
  assert len(ranked) == 2 and set(ranked) <= labels  # config.json's id2label.

  command[3] = f'--source={HUB / "timm_qknorm"}'
  result = subprocess.run(command, env=run_env, capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
  assert lines[0].startswith('error: ') and 'qk_norm with biases' in lines[0]


def test_a_hub_checkpoint_brings_its_own_preprocessing(tmp_path):
  """timm's pretrained_cfg (here AugReg's: crop 0.9, bicubic, [-1, 1]) and transformers'
  preprocessor_config.json travel with the weights, also to another input size."""
  loaded = checkpoints.load(str(HUB / 'timm_augreg'))
  want = preprocess.EvalSpec('shorter', 0.9, 'pil_bicubic', (0.5,) * 3, (0.5,) * 3, 'round')
  assert loaded.preprocessing == want
  assert checkpoints.load(str(HUB / 'timm_augreg'), image_size=48).preprocessing == want
  assert want.spec((32, 32)) == ("decode|resize_small(35, 'pil_bicubic')|central_crop(32, "
                                 "'round')|value_range(-1, 1)")
  folder = tmp_path / 'hf'
  shutil.copytree(HUB / 'hf_vit_cls', folder)
  (folder / 'preprocessor_config.json').write_text(json.dumps(dict(
      size=dict(shortest_edge=36), crop_size=dict(height=32, width=32), do_center_crop=True,
      resample=3, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])))
  assert checkpoints.load(str(folder)).preprocessing == preprocess.EvalSpec(
      'shorter', 32 / 36, 'pil_bicubic', (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
  model = get_model('ti16', num_classes=3, image_size=32, patch_size=8)
  params = jax.eval_shape(model.init, jax.random.key(0), np.zeros((1, 32, 32, 3)))['params']
  checkpoints.export(model, jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), params),
                     tmp_path / 'm.npz')
  assert checkpoints.load(str(tmp_path / 'm.npz')).preprocessing == preprocess.EvalSpec()


def test_a_non_square_timm_folder_exports_the_preprocessing_timm_was_checked_on(tmp_path):
  """A 24x32 folder's rule (aspect ratio kept, then the crop) travels as the pretrained_cfg of
  tests/data/preprocess's timm_24x32 case, which timm itself made pixels of; transformers'
  processors cannot do it, and say so in one line instead of cropping another part."""
  loaded = checkpoints.load(str(HUB / 'timm_gap_nofcnorm'))
  checkpoints.export(loaded.model, loaded.params, tmp_path / 'timm', 'timm', loaded.class_names,
                     loaded.preprocessing)
  settings = json.loads(str(np.load(HUB.parent / 'preprocess' / 'reference.npz')[
      'timm_24x32/settings']))
  cfg = json.loads((tmp_path / 'timm' / 'config.json').read_text())['pretrained_cfg']
  assert {k: cfg[k] for k in settings} == settings
  assert checkpoints.load(str(tmp_path / 'timm')).preprocessing == loaded.preprocessing
  with pytest.raises(errors.CheckpointError, match=r"^transformers' image processors cannot "
                     r'resize as .* at 24x32 \(keep the aspect ratio, cover 26x35'):
    checkpoints.export(loaded.model, loaded.params, tmp_path / 'hf', 'transformers',
                       loaded.class_names, loaded.preprocessing)
  assert not (tmp_path / 'hf').exists()


def test_export_formats_and_refusals(tmp_path):
  model = get_model('deit3_s16', num_classes=3, hidden_size=32, mlp_dim=64, num_heads=2,
                    num_layers=2, patch_size=8, image_size=32)
  shapes = jax.eval_shape(model.init, jax.random.key(0), np.zeros((1, 32, 32, 3)))['params']
  params = jax.tree.map(lambda x: np.ones(x.shape, x.dtype), shapes)
  assert checkpoints.export(model, params, tmp_path / 'timm', 'timm') == str(tmp_path / 'timm')
  assert formats.origin(str(tmp_path / 'timm')) == 'timm'
  checkpoints.export(model, params, tmp_path / 'm.npz')  # Its options beside the arrays.
  assert checkpoints.load(str(tmp_path / 'm.npz')).model.layer_scale == 1e-6
  with pytest.raises(errors.ConfigError, match="format='onnx' is not one of npz, timm"):
    checkpoints.export(model, params, tmp_path / 'x', 'onnx')


def test_a_class_token_without_position_embedding_exports_as_a_zero_row(tmp_path):
  """The release layout adds a row for the class token: zero, it is the same function."""
  model = get_model('ti16', num_classes=3, hidden_size=32, mlp_dim=64, num_heads=2,
                    num_layers=2, patch_size=8, image_size=32, prefix_posemb=False)
  shapes = jax.eval_shape(model.init, jax.random.key(0), np.zeros((1, 32, 32, 3)))['params']
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: rng.normal(0, 0.2, x.shape).astype(np.float32), shapes)
  checkpoints.export(model, params, tmp_path / 'm.npz')
  loaded = checkpoints.load(str(tmp_path / 'm.npz'))
  assert loaded.model.prefix_posemb and loaded.params['Transformer']['posembed_input'][
      'pos_embedding'].shape == (1, 17, 32)
  images = rng.uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
  chex.assert_trees_all_close(loaded.model.apply({'params': loaded.params}, images),
                              model.apply({'params': params}, images), rtol=1e-6, atol=1e-6)
  assert hub.folder_format(tmp_path) is None


BIG_VISION = pathlib.Path(__file__).resolve().parent / 'data' / 'big_vision'
KERNEL = 'embedding/kernel'


def test_resample_patchemb_gives_big_visions_numbers():
  """flexi_resample.npz: kernels resampled by big_vision's own resample_patchemb
  (make_flexi_fixture.py): up and down, integer and not, non-square."""
  cases = np.load(BIG_VISION / 'flexi_resample.npz')
  for i in range(len([k for k in cases if k.startswith('in_')])):
    ours = fit.resample_patchemb(cases[f'in_{i}'], tuple(cases[f'new_hw_{i}']))
    assert ours.dtype == np.float32
    chex.assert_trees_all_close(ours, cases[f'out_{i}'], atol=1e-5, rtol=0)


def _patchwise_resize(images, patch, new_patch):
  """Each patch resized on its own (bilinear: half-pixel centres, edges clamped, as
  tf.image.resize), the patches laid out again: FlexiViT's resized patches."""
  n, h, w, c = images.shape
  gh, gw = h // patch, w // patch
  patches = images.reshape(n * gh, patch, gw, patch, c).transpose(0, 2, 1, 3, 4)
  resized = jax.image.resize(patches.reshape(-1, patch, patch, c),
                             (n * gh * gw, new_patch, new_patch, c), 'bilinear', antialias=False)
  return np.asarray(resized).reshape(n, gh, gw, new_patch, new_patch, c).transpose(
      0, 1, 3, 2, 4, 5).reshape(n, gh * new_patch, gw * new_patch, c)


def _tokens(loaded, images):
  """The patch embedding's output in the model's own forward pass, and the logits."""
  logits, state = loaded.model.apply(
      {'params': loaded.params}, images,
      capture_intermediates=lambda module, _: module.name == 'embedding')
  return state['intermediates']['embedding']['__call__'][0], logits


def test_a_load_at_another_patch_size_gives_the_same_tokens_for_resized_patches():
  """FlexiViT's property: big_vision's 4x4-patch classifier (16x24 images, 4x6 grid) loaded
  at 8x8 patches on 32x48 images embeds each patch resized 2x to the token the 4x4 patch had;
  the grid is the same, so the position embeddings and the logits are too."""
  source = str(BIG_VISION / 'tok_params.npz')
  loaded = checkpoints.load(source, image_size=(16, 24), source_grid=(4, 6))
  flexi = checkpoints.load(source, image_size=(32, 48), source_grid=(4, 6), patch_size=8)
  assert flexi.model.patch_size == (8, 8) and flexi.model.grid == (4, 6)
  before, after = layout.flatten(loaded.params), layout.flatten(flexi.params)
  chex.assert_trees_all_equal(after.pop(KERNEL), fit.resample_patchemb(before.pop(KERNEL), 8))
  chex.assert_trees_all_equal(after, before)  # Everything else as it was.
  images = np.random.default_rng(0).uniform(-1, 1, (2, 16, 24, 3)).astype(np.float32)
  tokens, logits = _tokens(loaded, images)
  flexi_tokens, flexi_logits = _tokens(flexi, _patchwise_resize(images, 4, 8))
  assert flexi_tokens.shape == tokens.shape == (2, 4, 6, 16)
  chex.assert_trees_all_close(flexi_tokens, tokens, atol=1e-5, rtol=1e-5)
  chex.assert_trees_all_close(flexi_logits, logits, atol=1e-5, rtol=1e-5)


def test_a_load_at_another_patch_size_keeps_the_input_and_resizes_the_position_embeddings(
    sources, tmp_path):
  """At the same input size the grid follows the patch (FlexiViT's sequence lengths): every
  kind of source, in one step (a single resize of the position embeddings)."""
  timm = checkpoints.load(sources['timm'])
  coarse = checkpoints.load(sources['timm'], patch_size=8)
  assert coarse.model.image_size == (32, 32) and coarse.model.grid == (4, 4)
  assert coarse.model.model_name != timm.model.model_name
  posemb = lambda loaded: layout.flatten(loaded.params)[layout.POSEMB_KEY]
  chex.assert_trees_all_close(posemb(coarse), fit.resize_posemb(posemb(timm), (4, 4), (8, 8), 0),
                              atol=1e-6, rtol=0)
  chex.assert_trees_all_close(layout.flatten(coarse.params)[KERNEL],
                              fit.resample_patchemb(layout.flatten(timm.params)[KERNEL], 8),
                              atol=1e-6, rtol=0)
  assert checkpoints.load(sources['npz'], patch_size=16).model.grid == (2, 2)
  assert checkpoints.load(sources['big_vision'], image_size=(16, 24), source_grid=(4, 6),
                          patch_size=2).model.grid == (8, 12)
  for source, kw in ((sources['timm'], {}), (sources['npz'], {}),
                     (sources['big_vision'], dict(image_size=(16, 24), source_grid=(4, 6)))):
    with pytest.raises(errors.ConfigError) as e:
      checkpoints.load(source, patch_size=5, **kw)
    assert 'patch_size=5 does not tile the' in str(e.value) and '\n' not in str(e.value)


def test_a_fine_tune_at_another_patch_size_resamples_the_patch_embedding(caplog):
  """fit.adapt (config.init_from's path) into a model of another patch size: resampled and
  logged, not refused; another width is still refused."""
  source_model = get_model('ti16', num_classes=3, hidden_size=32, mlp_dim=64, num_heads=2,
                           num_layers=2, patch_size=8, image_size=32)
  shapes = lambda m: jax.eval_shape(m.init, jax.random.key(0), np.zeros((1, 32, 32, 3)))['params']
  rng = np.random.default_rng(0)
  source = layout.flatten(jax.tree.map(lambda x: rng.normal(0, 1, x.shape).astype(np.float32),
                                       shapes(source_model)))
  model = source_model.clone(patch_size=(4, 4))
  with caplog.at_level('INFO'):
    tuned = layout.flatten(fit.adapt(source, shapes(model), model))
  chex.assert_trees_all_equal(tuned[KERNEL], fit.resample_patchemb(source[KERNEL], 4))
  chex.assert_trees_all_close(tuned[layout.POSEMB_KEY],
                              fit.resize_posemb(source[layout.POSEMB_KEY], (8, 8), (4, 4)),
                              atol=1e-6, rtol=0)
  assert 'embedding/kernel resampled (8, 8, 3, 32) -> (4, 4, 3, 32)' in caplog.text
  wider = source_model.clone(patch_size=(4, 4), hidden_size=64, num_heads=2, mlp_dim=64)
  with pytest.raises(errors.CheckpointMismatchError, match=r'embedding/kernel: \(8, 8, 3, 32\) '
                     r'vs \(4, 4, 3, 64\)'):
    fit.adapt(source, shapes(wider), wider)
