"""vit_jax.checkpoints.formats.hub: timm's and transformers' folders, read and written, against the
fixtures those libraries wrote (tests/data/hub: README.md, make_fixtures.py)."""

import json
import pathlib
import shutil

import chex
import jax
import numpy as np
import pytest

from vit_jax.base import errors
from vit_jax.checkpoints import formats
from vit_jax.checkpoints.formats import hub, layout, timm
from vit_jax.models import get_model

HUB = pathlib.Path(__file__).resolve().parent / 'data' / 'hub'
TIMM = ('timm_augreg', 'timm_deit3', 'timm_reg4_gap', 'timm_gap_fcnorm', 'timm_gap_nofcnorm')
TRANSFORMERS = ('hf_vit_cls', 'hf_vit_cls_tanh', 'hf_vit_model')
LABELS = ('tench', 'goldfish', 'great white shark', 'tiger shark', 'hammerhead')
# What each fixture's architecture is, read from its config.json and arrays.
OPTIONS = {
    'timm_augreg': dict(pool='token', has_class_token=True, num_registers=0, prefix_posemb=True,
                        fc_norm=False, layer_scale=None, activation='gelu', mlp_dim=128),
    'timm_deit3': dict(pool='token', prefix_posemb=False, layer_scale=1e-6, activation='gelu',
                       patch_size=(4, 4)),
    'timm_reg4_gap': dict(pool='gap', has_class_token=False, num_registers=4,
                          prefix_posemb=False, fc_norm=True, layer_scale=None),
    'timm_gap_fcnorm': dict(pool='gap', has_class_token=False, num_registers=0, fc_norm=True),
    'timm_gap_nofcnorm': dict(pool='gap', has_class_token=False, fc_norm=False,
                              image_size=(24, 32)),
    'hf_vit_cls': dict(pool='token', activation='gelu', norm_epsilon=1e-12, num_classes=5),
    'hf_vit_cls_tanh': dict(activation='gelu_tanh', norm_epsilon=1e-6),
    'hf_vit_model': dict(num_classes=None, representation_size=32, patch_size=(4, 4)),
}


@pytest.fixture(scope='module')
def reference():
  return np.load(HUB / 'logits.npz')


def relative_error(got, want):
  return float(np.abs(np.asarray(got) - want).max() / np.abs(want).max())


def outputs(loaded, images, pre_logits=False):
  """The loaded model's logits (or, ``pre_logits``, the features its classifier reads)."""
  model, params = loaded.model.clone(attention_impl='einsum'), loaded.params
  if pre_logits:
    model = model.clone(num_classes=None)
    params = {k: v for k, v in params.items() if k != 'head'}
  return np.asarray(jax.jit(model.apply)({'params': params}, images))


@pytest.mark.parametrize('name', TIMM + TRANSFORMERS)
def test_fixtures_give_their_library_outputs(name, reference):
  loaded = formats.load_folder(HUB / name)
  for key, value in OPTIONS[name].items():
    got = getattr(loaded.model, key)
    assert got == (value if key not in ('patch_size', 'image_size') else tuple(value)), key
  images = reference[str(reference[f'{name}/input'])] if f'{name}/input' in reference else (
      reference['images'])
  if name == 'hf_vit_model':  # No classifier: the pooler's output is the model's.
    assert relative_error(outputs(loaded, images), reference[f'{name}/pooler_output']) <= 1e-5
    return
  assert loaded.class_names == LABELS
  assert relative_error(outputs(loaded, images), reference[f'{name}/logits']) <= 1e-5
  assert relative_error(outputs(loaded, images, pre_logits=True),
                        reference[f'{name}/pre_logits']) <= 1e-5


def test_timm_qk_norm_with_biases_is_refused_naming_the_option():
  with pytest.raises(errors.CheckpointMismatchError,
                     match=r'qk_norm with biases \(blocks.0.attn.k_norm.bias is not zero\)'):
    formats.load_folder(HUB / 'timm_qknorm')


def test_timm_qk_norm_without_biases_is_vit_jax_qk_norm(tmp_path):
  tensors = hub.read_weights(HUB / 'timm_qknorm')
  tensors = {k: np.zeros_like(v) if k.endswith(('q_norm.bias', 'k_norm.bias')) else v
             for k, v in tensors.items()}
  hub.write_folder(tmp_path, tensors, hub.read_json(HUB / 'timm_qknorm' / 'config.json'))
  loaded = formats.load_folder(tmp_path)
  assert loaded.model.qk_norm
  scale = loaded.params['Transformer']['encoderblock_1']['MultiHeadDotProductAttention_1'][
      'query_ln']['scale']
  chex.assert_trees_all_equal(scale, tensors['blocks.1.attn.q_norm.weight'])


def rewritten(tmp_path, name, config=None, tensors=None):
  """A copy of fixture ``name`` with its config.json and tensors changed."""
  folder = tmp_path / f'{name}-changed'
  hub.write_folder(folder, tensors or hub.read_weights(HUB / name),
                   config or hub.read_json(HUB / name / 'config.json'))
  return folder


@pytest.mark.parametrize('change, message', [
    (dict(architecture='vit_base_patch16_clip_224'), 'pre_norm'),
    (dict(model_args={'global_pool': 'map'}), "global_pool='map'"),
    (dict(model_args={'act_layer': 'relu'}), "act_layer='relu'"),
    (dict(model_args={'no_such_option': 1}), 'timm argument no_such_option=1'),
    (dict(architecture='deit_tiny_distilled_patch16_224'), 'distillation token'),
    (dict(architecture='vit_unknown_patch16_224', model_args={}), "'vit_unknown_patch16_224'"),
])
def test_timm_options_without_a_counterpart_are_one_line(tmp_path, change, message):
  config = hub.read_json(HUB / 'timm_augreg' / 'config.json')
  for key, value in change.items():
    config[key] = {**config[key], **value} if key == 'model_args' and value else value
  with pytest.raises(errors.CheckpointError) as e:
    formats.load_folder(rewritten(tmp_path, 'timm_augreg', config=config))
  assert message in str(e.value) and '\n' not in str(e.value)


def test_tensors_without_a_counterpart_are_named(tmp_path):
  tensors = {**hub.read_weights(HUB / 'timm_augreg'),
             'norm_pre.weight': np.ones(32, np.float32)}
  with pytest.raises(errors.CheckpointMismatchError, match='norm_pre.weight have no counterpart'):
    formats.load_folder(rewritten(tmp_path, 'timm_augreg', tensors=tensors))


@pytest.mark.parametrize('extra', ['blocks.2.norm1.weight', 'blocks.7.mlp.fc3.weight',
                                   'blocks.0.attn.extra'])
def test_a_stray_tensor_is_named_not_taken_for_another_model(tmp_path, extra):
  """One tensor more than the model has, in or beyond its blocks: named, the blocks kept."""
  tensors = {**hub.read_weights(HUB / 'timm_augreg'), extra: np.ones(32, np.float32)}
  with pytest.raises(errors.CheckpointMismatchError) as e:
    formats.load_folder(rewritten(tmp_path, 'timm_augreg', tensors=tensors))
  assert f'{extra} ha' in str(e.value) and 'no counterpart' in str(e.value)
  assert '\n' not in str(e.value)


def test_a_block_missing_from_the_sequence_is_named(tmp_path):
  tensors = {k.replace('blocks.0.', 'blocks.2.'): v
             for k, v in hub.read_weights(HUB / 'timm_augreg').items()}
  with pytest.raises(errors.CheckpointMismatchError,
                     match=r'blocks.0 is missing, but block 2 is there'):
    formats.load_folder(rewritten(tmp_path, 'timm_augreg', tensors=tensors))


@pytest.mark.parametrize('name', ['timm_augreg', 'hf_vit_cls'])
def test_weights_holding_nan_are_refused_in_one_line(tmp_path, name):
  tensors = hub.read_weights(HUB / name)
  key = sorted(tensors)[3]
  tensors[key] = np.where(np.arange(tensors[key].size).reshape(tensors[key].shape) == 1, np.nan,
                          tensors[key]).astype(np.float32)
  with pytest.raises(errors.NonFiniteCheckpointError) as e:
    formats.load_folder(rewritten(tmp_path, name, tensors=tensors))
  assert f': {key} holds NaN or Inf' in str(e.value) and '\n' not in str(e.value)  # Its name.


@pytest.mark.parametrize('dtype', [np.int32, np.int64, np.uint8, np.bool_])
def test_an_integer_tensor_the_model_holds_as_float_is_refused_by_name(tmp_path, dtype):
  """A LayerNorm's scale stored as integers (0.96 read as 0) is refused, naming the file's
  tensor; a BatchNorm's integer count is not a weight, and is read past."""
  import safetensors.numpy

  folder = tmp_path / 'ints'
  folder.mkdir()
  shutil.copy(HUB / 'timm_augreg' / 'config.json', folder)
  tensors = hub.read_weights(HUB / 'timm_augreg')
  tensors['blocks.0.norm1.weight'] = tensors['blocks.0.norm1.weight'].astype(dtype)
  (folder / 'model.safetensors').write_bytes(safetensors.numpy.save(tensors))
  with pytest.raises(errors.CheckpointError) as e:
    formats.load_folder(folder)
  assert f'{folder}: blocks.0.norm1.weight is {np.dtype(dtype).name}, but the model holds it ' \
      'as floating point' in str(e.value) and '\n' not in str(e.value)
  hub.check_tensors({'stem.norm.num_batches_tracked': np.array(7, np.int64)}, 'a hybrid')


def test_transformers_refusals_and_torch_pickles(tmp_path):
  config = {**hub.read_json(HUB / 'hf_vit_cls' / 'config.json'), 'model_type': 'beit'}
  with pytest.raises(errors.CheckpointMismatchError, match="model_type 'beit'"):
    formats.load_folder(rewritten(tmp_path, 'hf_vit_cls', config=config))
  config = {**hub.read_json(HUB / 'hf_vit_cls' / 'config.json'), 'hidden_act': 'relu'}
  with pytest.raises(errors.CheckpointMismatchError, match="hidden_act='relu'"):
    formats.load_folder(rewritten(tmp_path, 'hf_vit_cls', config=config))
  pickled = tmp_path / 'pickled'
  pickled.mkdir()
  shutil.copy(HUB / 'hf_vit_cls' / 'config.json', pickled)
  (pickled / 'pytorch_model.bin').write_bytes(b'not read')
  with pytest.raises(errors.CheckpointError, match='pytorch_model.bin .* reads safetensors only'):
    formats.load_folder(pickled)


def test_bfloat16_and_sharded_weights_load(tmp_path):
  import ml_dtypes
  import safetensors.numpy

  tensors = hub.read_weights(HUB / 'hf_vit_cls_tanh')
  folder = tmp_path / 'sharded'
  folder.mkdir()
  shutil.copy(HUB / 'hf_vit_cls_tanh' / 'config.json', folder)
  names = sorted(tensors)
  halves = {'model-00001-of-00002.safetensors': names[:20],
            'model-00002-of-00002.safetensors': names[20:]}
  for file, keys in halves.items():
    (folder / file).write_bytes(safetensors.numpy.save(
        {k: tensors[k].astype(ml_dtypes.bfloat16).view(np.uint16) for k in keys}))
  # safetensors' numpy writer has no bfloat16: the header's dtype is set by hand.
  for file in halves:
    data = bytearray((folder / file).read_bytes())
    n = int.from_bytes(data[:8], 'little')
    header = data[8:8 + n].decode().replace('"U16"', '"BF16"').encode()
    (folder / file).write_bytes(len(header).to_bytes(8, 'little') + header + bytes(data[8 + n:]))
  (folder / hub.WEIGHTS_INDEX).write_text(json.dumps(
      {'weight_map': {k: file for file, keys in halves.items() for k in keys}}))
  read = hub.read_weights(folder)
  assert set(read) == set(tensors) and read['classifier.bias'].dtype == ml_dtypes.bfloat16
  loaded = formats.load_folder(folder)
  want = tensors['classifier.weight'].astype(ml_dtypes.bfloat16).astype(np.float32).T
  chex.assert_trees_all_equal(loaded.params['head']['kernel'], want)
  # A shard not downloaded: one line naming it, from the plan's cheap check and the load.
  (folder / 'model-00002-of-00002.safetensors').unlink()
  for read in (lambda: hub.read_weights(folder, arrays=False), lambda: hub.read_weights(folder)):
    with pytest.raises(errors.MissingFileError, match=r'names 2 weight files, and '
                       r'model-00002-of-00002.safetensors is not in .*: a partial download'):
      read()


@pytest.mark.parametrize('name', TIMM + TRANSFORMERS)
def test_export_writes_what_the_library_wrote(name, tmp_path):
  """Written back in its own library's format, a fixture's tensors are the library's own, bit
  for bit, and its config.json holds every field the library needs to rebuild it."""
  library = 'timm' if name.startswith('timm') else 'transformers'
  loaded = formats.load_folder(HUB / name)
  formats.export(loaded.model, loaded.params, tmp_path, library, loaded.class_names)
  theirs, ours = hub.read_weights(HUB / name), hub.read_weights(tmp_path)
  assert {k: (v.shape, v.dtype) for k, v in ours.items()} == {
      k: (v.shape, v.dtype) for k, v in theirs.items()}
  chex.assert_trees_all_equal(ours, theirs)
  config, written = (hub.read_json(d / 'config.json') for d in (HUB / name, tmp_path))
  if library == 'timm':
    assert written['model_args'].items() >= config['model_args'].items()
    for key in ('num_classes', 'num_features', 'global_pool', 'label_names'):
      assert written[key] == config[key], key
    # What timm builds: the named architecture's defaults under model_args, as the fixture's.
    assert timm.arguments(written, 'ours') == {**timm.arguments(config, 'theirs'),
                                                   **written['model_args']}
  else:
    for key, value in config.items():
      if key not in ('transformers_version', 'encoder_stride'):
        assert written[key] == value, key
    assert (tmp_path / 'preprocessor_config.json').exists()
  again = formats.load_folder(tmp_path)
  assert again.model == loaded.model.clone(model_name=again.model.model_name)
  assert again.class_names == loaded.class_names


# Every fixture timm and transformers wrote that vit_jax loads (timm_qknorm's q/k norm biases
# are refused) as what it is (hf_siglip2_model, image and text towers: its image tower).
WRITTEN = tuple(sorted(p.name for p in HUB.iterdir() if p.is_dir() and p.name not in (
    'timm_qknorm', 'hf_siglip2_model') and p.name.startswith(('timm_', 'hf_'))))
_PRETRAINED = ('mean', 'std', 'interpolation', 'crop_pct', 'crop_mode')


@pytest.mark.parametrize('name', WRITTEN)
def test_an_export_of_what_load_returned_is_the_checkpoint_it_was(name, tmp_path, caplog):
  """``export(loaded, OUT, library)``, in the fixture's own library: the architecture's name
  (timm's with its model_args; transformers' model_type and class), the class names and the
  preprocessing (pretrained_cfg's mean, std, interpolation and crop; the image processor's)
  are the fixture's own, without being given."""
  library = 'timm' if name.startswith('timm') else 'transformers'
  loaded = formats.load(str(HUB / name))
  with caplog.at_level('WARNING'):
    assert formats.export(loaded, str(tmp_path), library) == str(tmp_path)
  assert 'no preprocessing' not in caplog.text
  theirs, ours = (hub.read_json(d / 'config.json') for d in (HUB / name, tmp_path))
  if library == 'timm':
    assert ours['architecture'] == theirs['architecture']
    size = {} if timm.is_naflex(theirs) else dict(img_size=list(loaded.model.image_size))
    assert ours['model_args'] == dict(theirs['model_args'], **size)
    assert ours.get('label_names') == theirs.get('label_names')
    for key in _PRETRAINED:
      assert ours['pretrained_cfg'][key] == theirs['pretrained_cfg'][key], key
  else:
    for key in ('model_type', 'architectures', 'id2label'):
      assert ours.get(key) == theirs.get(key), key
    processor = HUB / name / 'preprocessor_config.json'
    if processor.exists():
      written = hub.read_json(tmp_path / 'preprocessor_config.json')
      for key in ('image_mean', 'image_std', 'resample'):
        assert written[key] == hub.read_json(processor)[key], key
  assert formats.preprocessing(tmp_path) == loaded.preprocessing
  again = formats.load_folder(tmp_path)
  assert again.model == loaded.model.clone(model_name=again.model.model_name)


def test_a_model_that_is_not_its_sources_architecture_is_not_named_it(tmp_path, caplog):
  """The source's name only where timm builds the model from it: another activation is
  another architecture, named by the registry's nearest with every argument; no
  preprocessing given is said in one warning line."""
  loaded = formats.load_folder(HUB / 'timm_dinov2')
  model = loaded.model.clone(activation='gelu_tanh')
  with caplog.at_level('WARNING'):
    formats.export(model, loaded.params, tmp_path / 'tanh', 'timm',
                   architecture=loaded.architecture)
  written = hub.read_json(tmp_path / 'tanh' / 'config.json')
  assert written['architecture'] == 'vit_base_patch16_224'
  assert timm.arguments(written, 'ours')['act_layer'] == 'gelu_tanh'
  again = formats.load_folder(tmp_path / 'tanh').model
  assert again == model.clone(model_name=again.model_name)
  warnings = [r.getMessage() for r in caplog.records if 'no preprocessing' in r.getMessage()]
  assert len(warnings) == 1 and '\n' not in warnings[0]
  formats.export(loaded.model, loaded.params, tmp_path / 'same', 'timm',
                 architecture=loaded.architecture)
  assert hub.read_json(tmp_path / 'same' / 'config.json')['architecture'] == (
      'vit_small_patch14_dinov2')
  with pytest.raises(errors.ConfigError, match='two formats given'):
    formats.export(loaded, tmp_path / 'x', 'timm', 'npz')


def tiny(name='ti16', seed=0, **kw):
  options = dict(hidden_size=32, mlp_dim=64, num_heads=2, num_layers=2, patch_size=8,
                 image_size=32, num_classes=5)
  model = get_model(name, **{**options, **kw})
  shapes = jax.eval_shape(model.init, jax.random.key(seed),
                          np.zeros((1, *model.image_size, 3)))['params']
  rng = np.random.default_rng(seed)  # Every parameter random, as the fixtures' are.
  return model, jax.tree.map(lambda x: rng.normal(0, 0.2, x.shape).astype(np.float32), shapes)


@pytest.mark.parametrize('name, options, library, config', [
    ('ti16', {}, 'timm', {'act_layer': 'gelu_tanh', 'init_values': None}),
    ('ti16', {}, 'transformers', {'hidden_act': 'gelu_pytorch_tanh', 'layer_norm_eps': 1e-6}),
    ('deit3_s16', {}, 'timm', {'init_values': 1e-6, 'no_embed_class': True}),
    ('b16_reg4_gap', {'image_size': (24, 32)}, 'timm', {'reg_tokens': 4, 'img_size': [24, 32]}),
    ('ti16', {'prefix_posemb': False}, 'transformers', {}),
    ('ti16', {'num_classes': None, 'representation_size': 16}, 'transformers',
     {'architectures': ['ViTModel'], 'pooler_output_size': 16}),
])
def test_vit_jax_models_export_and_read_back_alike(name, options, library, config, tmp_path):
  model, params = tiny(name, **options)
  formats.export(model, params, tmp_path, library)
  written = hub.read_json(tmp_path / 'config.json')
  assert (written.get('model_args') or written).items() >= config.items()
  again = formats.load_folder(tmp_path)
  images = np.random.default_rng(0).uniform(-1, 1, (2, *model.image_size, 3)).astype(np.float32)
  want = model.apply({'params': params}, images)
  chex.assert_trees_all_close(again.model.apply({'params': again.params}, images), want,
                              rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('options, library, message', [
    ({'num_registers': 4, 'pool': 'gap', 'class_token': False}, 'transformers',
     "num_registers=4. Export it as format='timm'"),
    ({'qk_norm': True}, 'transformers', "qk_norm. Export it as format='timm'"),
    ({'representation_size': 16}, 'timm', "representation_size (a pre-logits layer). Export it "
     "as format='npz'"),
    ({'norm_epsilon': 1e-12}, 'timm', "norm_epsilon=1e-12 (timm's LayerNorms: 1e-6). Export it "
     "as format='transformers'"),
    ({'pool': 'map', 'class_token': True}, 'transformers', 'a class token beside the MAP head'),
    ({'posemb': 'sincos2d'}, 'transformers', "posemb='sincos2d'"),
])
def test_what_a_library_cannot_hold_is_refused_in_one_line(options, library, message, tmp_path):
  model, params = tiny(**options)
  with pytest.raises(errors.CheckpointError) as e:
    formats.export(model, params, tmp_path, library)
  assert message in str(e.value) and '\n' not in str(e.value)
  assert not (tmp_path / 'model.safetensors').exists()


def test_timm_architecture_names():
  assert timm.architecture(get_model('b16', num_classes=10)) == 'vit_base_patch16_224'
  assert timm.architecture(get_model('b16', num_classes=10, image_size=384)) == (
      'vit_base_patch16_384')
  assert timm.architecture(get_model('deit3_s16', num_classes=10)) == (
      'deit3_small_patch16_224')
  assert timm.architecture(get_model('b16_reg4_gap', num_classes=10, image_size=256)) == (
      'vit_base_patch16_reg4_gap_256')
  # No such timm name: the family's base name, its model_args give the sizes.
  assert timm.architecture(get_model('s16', num_classes=10, image_size=96)) == (
      'vit_base_patch16_224')


def test_timm_loads_an_export_with_the_same_logits(tmp_path):
  """Only where torch and timm are installed (never in CI: check_exports.py runs them)."""
  pytest.importorskip('torch')
  timm = pytest.importorskip('timm')
  import torch

  model, params = tiny('deit3_s16', patch_size=4)
  formats.export(model, params, tmp_path, 'timm')
  images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
  theirs = timm.create_model(f'local-dir:{tmp_path}', pretrained=True).eval()
  with torch.no_grad():
    got = theirs(torch.from_numpy(images.transpose(0, 3, 1, 2).copy())).numpy()
  assert relative_error(got, np.asarray(model.apply({'params': params}, images))) <= 1e-5


def test_release_layout_names_are_kept():
  """The new options add parameters beside the release's, never rename them."""
  model, params = tiny('deit3_s16')
  flat = layout.flatten(params)
  assert {'Transformer/encoderblock_0/ls1', 'Transformer/encoderblock_0/ls2', 'cls',
          'Transformer/posembed_input/pos_embedding'} <= set(flat)
  chex.assert_shape(flat['Transformer/posembed_input/pos_embedding'], (1, 16, 32))
