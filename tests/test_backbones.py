"""The backbones people fine-tune from (CLIP, SigLIP, DINOv2, distilled DeiT), as timm and
transformers wrote them (tests/data/hub: BACKBONES.md, make_backbone_fixtures.py), loaded by
vit_jax.checkpoints.formats with the library's outputs."""

import json
import pathlib
import re
import shutil

import chex
import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from vit_jax import checkpoints
from vit_jax.base import errors
from vit_jax.checkpoints import formats
from vit_jax.checkpoints.formats import fit, hub, layout, release, timm
from vit_jax.data import preprocess
from vit_jax.models import get_model, naflex
from vit_jax.models.posemb import Rope

HUB = pathlib.Path(__file__).resolve().parent / 'data' / 'hub'
LABELS = ('tench', 'goldfish', 'great white shark', 'tiger shark', 'hammerhead')
# What each fixture is, read from its config.json and arrays; the output compared.
OPTIONS = {
    'timm_clip': dict(pre_norm=True, activation='gelu', norm_epsilon=1e-5, num_classes=5),
    'timm_clip_quickgelu': dict(pre_norm=True, activation='quick_gelu', num_classes=None),
    'timm_siglip_map': dict(pool='map', has_class_token=False, activation='gelu'),
    'timm_dinov2_swiglu': dict(gated_mlp=True, activation='silu', mlp_dim=85, layer_scale=1e-5),
    'timm_deit_distilled': dict(distill_token=True, num_prefix_tokens=2, pool='token'),
    'hf_clip_vision': dict(pre_norm=True, activation='quick_gelu', norm_epsilon=1e-5),
    'hf_siglip_vision': dict(pool='map', has_class_token=False, activation='gelu_tanh'),
    'hf_dinov2': dict(gated_mlp=False, activation='gelu', mlp_dim=64, layer_scale=1.),
    'hf_dinov2_swiglu': dict(gated_mlp=True, activation='silu', mlp_dim=88),
    'hf_deit_distilled': dict(distill_token=True, activation='gelu', norm_epsilon=1e-12),
}


@pytest.fixture(scope='module')
def reference():
  return np.load(HUB / 'backbone_logits.npz')


def relative_error(got, want):
  return float(np.abs(np.asarray(got) - want).max() / np.abs(want).max())


def outputs(model, params, images):
  return np.asarray(jax.jit(model.clone(attention_impl='einsum').apply)({'params': params},
                                                                         images))


@pytest.mark.parametrize('name', sorted(OPTIONS))
def test_fixtures_give_their_library_outputs(name, reference):
  """Logits where there is a classifier, and the features (timm's pre_logits, transformers'
  pooler_output) always, from ``model.apply``."""
  loaded = formats.load_folder(HUB / name)
  for key, value in OPTIONS[name].items():
    assert getattr(loaded.model, key) == value, key
  model, params = loaded.model, loaded.params
  features = 'pre_logits' if f'{name}/pre_logits' in reference else 'pooler_output'
  if model.num_classes:
    assert loaded.class_names == LABELS
    assert relative_error(outputs(model, params, reference['images']),
                          reference[f'{name}/logits']) <= 1e-5
    model = model.clone(num_classes=None)
    params = {k: v for k, v in params.items() if k not in ('head', 'head_dist')}
  assert relative_error(outputs(model, params, reference['images']),
                        reference[f'{name}/{features}']) <= 1e-5


def rewritten(tmp_path, name, drop=(), config=None):
  """A copy of fixture ``name`` without the tensors that start with ``drop``, config.json
  updated with ``config``."""
  folder = tmp_path / name
  shutil.copytree(HUB / name, folder)
  tensors = load_file(folder / 'model.safetensors')
  save_file({k: v for k, v in tensors.items() if not k.startswith(tuple(drop))},
            folder / 'model.safetensors')
  c = json.loads((folder / 'config.json').read_text())
  (folder / 'config.json').write_text(json.dumps({**c, **(config or {})}))
  return folder


@pytest.mark.parametrize('name, drop, config, message', [
    ('hf_deit_distilled', ('distillation_classifier',), None,
     r'a DeiT without its distillation classifier .* \(DeiTForImageClassificationWithTeacher '
     r'loads\)'),
    ('hf_siglip_vision', ('head.',), None, r'without its head \(vision_use_head=False\)'),
    ('hf_clip_vision', (), {'model_type': 'vit_mae'}, "transformers model_type 'vit_mae'"),
    ('timm_siglip_map', (), {'architecture': 'vit_giant_patch14_dinov2'},
     "SwiGLUPacked with global_pool='map'"),
])
def test_what_has_no_option_is_refused_in_one_line(tmp_path, name, drop, config, message):
  with pytest.raises(errors.CheckpointMismatchError, match=message) as e:
    formats.load_folder(rewritten(tmp_path, name, drop, config))
  assert '\n' not in str(e.value)


@pytest.mark.parametrize('name', [n for n in sorted(OPTIONS) if n.startswith('timm')])
def test_timm_export_writes_what_timm_wrote(name, tmp_path):
  """Written back as timm's, a fixture's tensors are timm's own, bit for bit, and what timm
  builds from its config.json is the fixture's architecture; read back, the same model."""
  loaded = formats.load_folder(HUB / name)
  formats.export(loaded.model, loaded.params, tmp_path, 'timm', loaded.class_names,
                 loaded.preprocessing)
  theirs, ours = hub.read_weights(HUB / name), hub.read_weights(tmp_path)
  assert sorted(ours) == sorted(theirs)
  chex.assert_trees_all_equal(ours, theirs)
  config, written = (hub.read_json(d / 'config.json') for d in (HUB / name, tmp_path))
  want, got = timm.arguments(config, 'theirs'), timm.arguments(written, 'ours')
  for key in ('pre_norm', 'distilled', 'mlp_layer', 'global_pool', 'class_token', 'norm_layer'):
    assert got[key] == want[key], key
  again = formats.load_folder(tmp_path)
  assert again.model == loaded.model.clone(model_name=again.model.model_name)
  assert again.class_names == loaded.class_names
  assert again.preprocessing == loaded.preprocessing  # timm's pretrained_cfg, as timm wrote it.


def test_a_pre_norm_models_patch_bias_moves_into_the_position_embeddings(tmp_path):
  """timm's pre_norm ViTs embed without a bias: a vit_jax model's exports with its bias in
  the patches' position embeddings, and computes the same."""
  model = get_model('ti16', num_classes=5, hidden_size=32, mlp_dim=64, num_heads=2,
                    num_layers=2, patch_size=8, image_size=32, pre_norm=True,
                    activation='quick_gelu', norm_epsilon=1e-5)
  shapes = jax.eval_shape(model.init, jax.random.key(0), np.zeros((1, 32, 32, 3)))['params']
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: rng.normal(0, 0.2, x.shape).astype(np.float32), shapes)
  formats.export(model, params, tmp_path, 'timm')
  assert 'patch_embed.proj.bias' not in hub.read_weights(tmp_path)
  assert hub.read_json(tmp_path / 'config.json')['architecture'] == 'vit_base_patch16_clip_224'
  again = formats.load_folder(tmp_path)
  assert again.model.pre_norm and not np.any(again.params['embedding']['bias'])
  images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
  assert relative_error(outputs(again.model, again.params, images),
                        outputs(model, params, images)) <= 1e-5


# A fixture -> the transformers class its export is.
TO_TRANSFORMERS = {
    'hf_clip_vision': 'CLIPVisionModel', 'hf_siglip_vision': 'SiglipVisionModel',
    'hf_dinov2': 'Dinov2Model', 'hf_dinov2_swiglu': 'Dinov2Model',
    'hf_deit_distilled': 'DeiTForImageClassificationWithTeacher',
    'timm_clip_quickgelu': 'CLIPVisionModel',
    'timm_deit_distilled': 'DeiTForImageClassificationWithTeacher'}


@pytest.mark.parametrize('name', sorted(TO_TRANSFORMERS))
def test_transformers_export_writes_what_transformers_wrote(name, tmp_path):
  """Written as transformers' class, a transformers fixture is the folder transformers wrote:
  the same tensors (names, shapes, values; DINOv2's mask_token, which no output reads, left
  out), the same bytes where none is left out, the same image processor and sizes. Any
  fixture reads back as the same model with the same parameters."""
  loaded = formats.load_folder(HUB / name)
  formats.export(loaded.model, loaded.params, tmp_path, 'transformers', loaded.class_names,
                 loaded.preprocessing)
  config = hub.read_json(tmp_path / 'config.json')
  assert config['architectures'] == [TO_TRANSFORMERS[name]]
  if name.startswith('hf_'):
    theirs = {k: v for k, v in hub.read_weights(HUB / name).items()
              if k != 'embeddings.mask_token'}
    chex.assert_trees_all_equal(hub.read_weights(tmp_path), theirs)
    same = (tmp_path / 'model.safetensors').read_bytes() == (
        HUB / name / 'model.safetensors').read_bytes()
    assert same == ('dinov2' not in name)
    processor = 'preprocessor_config.json'
    assert hub.read_json(tmp_path / processor) == hub.read_json(HUB / name / processor)
    fixture = hub.read_json(HUB / name / 'config.json')
    for key in ('model_type', 'hidden_act', 'layer_norm_eps', 'image_size', 'patch_size',
                'hidden_size', 'num_hidden_layers', 'num_attention_heads', 'id2label'):
      if not (key == 'hidden_act' and config.get('use_swiglu_ffn')):  # SwiGLU: silu always.
        assert config.get(key) == fixture.get(key), key
  again = formats.load_folder(tmp_path)
  assert again.model == loaded.model.clone(model_name=again.model.model_name)
  chex.assert_trees_all_equal(again.params, loaded.params)
  assert again.class_names == loaded.class_names


def tiny(**options):
  model = get_model('ti16', **{**dict(num_classes=5, hidden_size=32, mlp_dim=64, num_heads=2,
                                      num_layers=2, patch_size=8, image_size=32), **options})
  shapes = jax.eval_shape(model.init, jax.random.key(0), np.zeros((1, *model.image_size, 3)))
  rng = np.random.default_rng(0)
  return model, jax.tree.map(lambda x: rng.normal(0, 0.2, x.shape).astype(np.float32),
                             shapes['params'])


def test_vit_jax_backbones_export_to_transformers_classes(tmp_path):
  """vit_jax-made models go to the class that computes them: a gated MLP with layer scale and a
  classifier to Dinov2ForImageClassification (the patches' mean read with zero weights), CLIP
  with a patch bias (moved into the position embeddings) to CLIPVisionModel; back the same."""
  images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
  for options, cls in (
      (dict(gated_mlp=True, activation='silu', layer_scale=1e-5, mlp_dim=88),
       'Dinov2ForImageClassification'),
      (dict(num_classes=None, pre_norm=True, activation='quick_gelu', norm_epsilon=1e-5),
       'CLIPVisionModel')):
    model, params = tiny(**options)
    formats.export(model, params, tmp_path / cls, 'transformers')
    assert hub.read_json(tmp_path / cls / 'config.json')['architectures'] == [cls]
    again = formats.load_folder(tmp_path / cls)
    assert relative_error(outputs(again.model, again.params, images),
                          outputs(model, params, images)) <= 1e-5
  weights = hub.read_weights(tmp_path / 'Dinov2ForImageClassification')
  assert weights['classifier.weight'].shape == (5, 64) and 'dinov2.layernorm.weight' in weights
  weights['classifier.weight'][:, 32:] = 0.1  # A classifier of the mean: not vit_jax's.
  save_file(weights, tmp_path / 'Dinov2ForImageClassification' / 'model.safetensors',
            {'format': 'pt'})
  with pytest.raises(errors.CheckpointMismatchError, match="Dinov2ForImageClassification's "
                     "classifier of the patch tokens' mean beside the class token"):
    formats.load_folder(tmp_path / 'Dinov2ForImageClassification')


_REFUSED = ('transformers cannot hold ViT (2 layers, width 32, MLP {mlp}, 2 heads, patch 8): '
            "{what}. Export it as format='timm' (--format=timm), or fine-tune a model without it.")


@pytest.mark.parametrize('options, what', [
    (dict(pre_norm=True), "a classifier on clip_vision_model (CLIPVisionModel has none; "
     "CLIPForImageClassification pools the patches' mean)"),
    (dict(pool='map', class_token=False), 'a classifier on siglip_vision_model '
     "(SiglipVisionModel has none; SiglipForImageClassification pools the patches' mean)"),
    (dict(distill_token=True, num_classes=None),
     'a distillation token without classifiers (DeiTModel pools the class token alone)'),
    (dict(gated_mlp=True, num_classes=None),
     "gated_mlp with activation='gelu_tanh' (DINOv2's SwiGLU gates with silu)"),
    (dict(distill_token=True, pre_norm=True),
     'pre_norm (a LayerNorm before the blocks) with deit'),
    (dict(layer_scale=0.1, mlp_dim=60), "mlp_dim=60 (Dinov2's is width * mlp_ratio, an int; "
     'gated: x 2/3, rounded up to 8s)'),
    (dict(pre_norm=True, num_classes=None, image_size=(32, 48)),
     'a non-square image_size (32, 48) or patch_size (8, 8) (clip_vision_model is square)'),
    (dict(layer_scale=0.1, num_registers=4), 'num_registers=4'),
])
def test_what_transformers_classes_cannot_hold_is_refused_in_one_line(options, what, tmp_path):
  """The class an option routes to cannot hold the rest: one line naming it and timm; nothing
  written."""
  model, params = tiny(**options)
  with pytest.raises(errors.CheckpointError) as e:
    formats.export(model, params, tmp_path / 'folder', 'transformers')
  assert str(e.value) == _REFUSED.format(mlp=model.mlp_dim, what=what)
  assert not list(tmp_path.iterdir())


@pytest.mark.parametrize('name', sorted(OPTIONS))
def test_npz_export_loads_back_with_the_same_outputs(name, tmp_path, reference):
  """A .npz export of every backbone loads back as the same model, its options (activation,
  epsilon, ...) read from beside the arrays: the same outputs, no option named by the user."""
  loaded = formats.load_folder(HUB / name)
  formats.export(loaded.model, loaded.params, tmp_path / 'm.npz')
  again = formats.load(str(tmp_path / 'm.npz'))
  for key, value in OPTIONS[name].items():
    assert getattr(again.model, key) == value, key
  chex.assert_trees_all_close(outputs(again.model, again.params, reference['images']),
                              outputs(loaded.model, loaded.params, reference['images']),
                              rtol=1e-6, atol=1e-6)


def test_a_npz_files_arrays_say_the_options_that_have_arrays(tmp_path):
  """Without the options written beside them, the arrays still say a LayerNorm before the
  blocks, a gated MLP, a distillation token, layer scale and q/k norms."""
  options = dict(pre_norm=True, gated_mlp=True, distill_token=True, layer_scale=1.,
                 qk_norm=True, qkv_bias=False)
  model, params = tiny(**options)
  formats.export(model, params, tmp_path / 'm.npz')
  with np.load(tmp_path / 'm.npz') as f:
    arrays = {k: f[k] for k in f.files if k != release.OPTIONS_KEY}
  assert len(arrays) < len(f.files)
  np.savez(tmp_path / 'bare.npz', **arrays)
  again = formats.load(str(tmp_path / 'bare.npz'))
  for key, value in options.items():
    assert getattr(again.model, key) == value, key
  images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
  chex.assert_trees_all_close(outputs(again.model, again.params, images),
                              outputs(model, params, images), rtol=1e-6, atol=1e-6)


def test_fine_tuning_a_distilled_deit_puts_two_fresh_heads_on_it():
  """init_from with other classes: both classifiers new (zero), the rest the checkpoint's."""
  loaded = formats.load_folder(HUB / 'timm_deit_distilled')
  model = loaded.model.clone(num_classes=10)
  init = jax.eval_shape(model.init, jax.random.key(0), np.zeros((1, 32, 32, 3)))['params']
  init = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), init)
  params = fit.adapt(layout.flatten(layout.to_release(loaded.params)), init, model,
                     keep_head=False, origin='deit')
  for head in ('head', 'head_dist'):
    chex.assert_trees_all_equal(params[head]['kernel'], np.zeros((32, 10), np.float32))
  chex.assert_trees_all_equal(params['dist'], loaded.params['dist'])


# tests/data/hub/refused (make_refused_fixtures.py, make_rope_fixtures.py: written by timm) ->
# what vit_jax names.
REFUSED = {
    'eva_post_norm': "timm's Eva with use_post_norm (EvaBlockPostNorm: each branch normalised "
                     'after it)',
    'eva_mrope': "timm's Eva with rope_type='mrope' (rotary types that load: cat, dinov3, mixed)",
    'eva_gqa': "timm's Eva with num_kv_heads=1 (grouped-query attention)",
    'sapiens2': "timm's Eva with num_kv_heads=1 (grouped-query attention)",
    'hybrid_r': "timm's vit_tiny_r_s16_p8_224, a hybrid with a ResNet stem (vit_jax's "
                "R+ViT-Ti_16, R26+ViT-S_32 and R50+ViT-B_16 load from the release's .npz files)",
    'parallel_scaling': "timm's parallel blocks (ParallelScalingBlock: attention and MLP side "
                        'by side from one fused projection)',
    'parallel_things': "timm's parallel blocks (ParallelThingsBlock: two attention and two MLP "
                       'branches side by side)',
    'respost': "timm's ResPost blocks (ResPostBlock: each branch normalised after it, not "
               'before)',
    'diff_attention': "timm's differential attention (attn_layer='diff': two softmax maps, one "
                      'subtracted)',
    'no_final_norm': "timm's final_norm=False (no LayerNorm after the blocks)",
    'map_registers': "global_pool='map' over the patches alone, beside 4 prefix tokens, which "
                     "vit_jax's ViT has no model option for (vit_jax's MAP head pools every "
                     'token)',
    'beit': "timm's beit_base_patch16_224, a BEiT model (a relative position bias in each "
            "block's attention, no absolute position embeddings)",
    'relpos': "timm's vit_relpos_base_patch16_224, a VisionTransformerRelPos model (a relative "
              'position bias in the attention, no absolute position embeddings)',
    'naflexvit': "timm's naflexvit_base_patch16_gap with pos_embed_interp_mode='bicubic'",
}
_NAFLEX_RESIZE = (" (vit_jax resizes the position embeddings to each image's grid bilinearly "
                  "with antialias, as SigLIP 2 does: pos_embed_interp_mode='bilinear', "
                  'pos_embed_antialias=True, no align_corners, aspect-ratio preserving or '
                  'grid_sample)')


@pytest.mark.parametrize('name', sorted(REFUSED))
def test_timm_architectures_without_an_option_are_refused_naming_the_architecture(name):
  """What timm wrote for an architecture vit_jax cannot compute (its tensors may look like a
  ViT's: Eva's, a ResPost block's) is refused in one line naming the architecture."""
  folder = HUB / 'refused' / name
  with pytest.raises(errors.CheckpointMismatchError) as e:
    formats.load_folder(folder)
  suffix = '' if name == 'map_registers' else ", which vit_jax's ViT has no model option for"
  suffix += _NAFLEX_RESIZE if name == 'naflexvit' else ''
  assert str(e.value) == f'{folder}: {REFUSED[name]}{suffix}.'


def test_a_map_pool_beside_prefix_tokens_is_not_exported_to_timm(tmp_path):
  """timm's attention pool leaves the prefix tokens out, vit_jax's MAP head reads them."""
  model, params = tiny(pool='map', class_token=True)
  with pytest.raises(errors.CheckpointError, match=r"^timm cannot hold .*: pool='map' beside 1 "
                     r"prefix tokens \(timm's attention pool leaves them out\)\. Export it as "
                     "format='npz'"):
    formats.export(model, params, tmp_path / 'folder', 'timm')
  assert not list(tmp_path.iterdir())


def test_a_timm_vit_with_fewer_position_rows_than_prefix_tokens_loads(tmp_path):
  """One patch, four registers without position embeddings: the arrays' square-grid guess of
  the image size has a negative count of patches to take a root of."""
  model = get_model('ti16', num_classes=None, image_size=16, num_registers=4, prefix_posemb=False)
  shapes = jax.eval_shape(model.init, jax.random.key(0), np.zeros((1, 16, 16, 3)))['params']
  formats.export(model, jax.tree.map(lambda s: np.full(s.shape, .01, np.float32), shapes),
                 tmp_path, 'timm')
  loaded = formats.load_folder(tmp_path)
  assert (loaded.model.image_size, loaded.model.num_registers) == ((16, 16), 4)


# The rotary-position fixtures (make_rope_fixtures.py, written by timm and transformers): each
# folder's kind of rotary encoding, and whether it has an absolute embedding too.
ROPE = {
    'timm_dinov3': ('dinov3', 'none'), 'timm_dinov3_swiglu': ('dinov3', 'none'),
    'timm_eva02': ('axial', 'learn'), 'timm_eva02_tiny': ('axial', 'learn'),
    'timm_eva02_clip': ('axial', 'learn'), 'timm_pe_core': ('axial', 'learn'),
    'timm_rope_axial': ('axial', 'none'), 'timm_rope_mixed': ('mixed', 'none'),
    'timm_rope_ape': ('axial', 'learn'), 'timm_rope_mixed_ape': ('mixed', 'learn'),
    'timm_rope_reg_gap': ('axial', 'none'), 'hf_dinov3': ('dinov3', 'none'),
    'hf_dinov3_gated': ('dinov3', 'none')}


@pytest.fixture(scope='module')
def rope_reference():
  return np.load(HUB / 'rope_logits.npz')


def rope_output(reference, name, suffix=''):
  """What the library computed: a classifier's logits, else its pooled features."""
  for key in ('logits', 'pre_logits', 'pooler_output'):
    if f'{name}/{key}{suffix}' in reference:
      return reference[f'{name}/{key}{suffix}']
  raise KeyError(name)


@pytest.mark.parametrize('name', sorted(ROPE))
def test_rotary_fixtures_give_their_library_outputs_at_any_grid(name, rope_reference):
  """At the size they were saved at, and the rotary-only ones at 24x40 too (a 3x5 grid, timm's
  dynamic_img_size), within 1e-4 of the library's outputs."""
  kind, absolute = ROPE[name]
  sizes = [('', 'images')] + ([('_24x40', 'images_24x40')] if absolute == 'none' else [])
  for suffix, images in sizes:
    images = rope_reference[images]
    loaded = formats.load(str(HUB / name), image_size=images.shape[1:3])
    assert Rope.parse(loaded.model.rope).kind == kind and loaded.model.posemb == absolute
    got = outputs(loaded.model, loaded.params, images)
    assert relative_error(got, rope_output(rope_reference, name, suffix)) < 1e-4, suffix


@pytest.mark.parametrize('name', sorted(ROPE))
def test_rotary_exports_write_what_their_library_wrote(name, tmp_path, rope_reference):
  """timm's Eva, DINOv3ViTModel: exported from what was loaded, loaded back with the same
  outputs; where the library wrote the layout vit_jax writes (a fused attention, a packed or
  plain MLP; transformers' DINOv3), the very tensors it wrote (DINOv3's mask_token aside)."""
  loaded = formats.load_folder(HUB / name)
  library = 'transformers' if name.startswith('hf_') else 'timm'
  formats.export(loaded.model, loaded.params, tmp_path / 'out', library,
                 preprocessing=loaded.preprocessing)
  back = formats.load_folder(tmp_path / 'out')
  images = rope_reference['images']
  chex.assert_trees_all_close(outputs(back.model, back.params, images),
                              outputs(loaded.model, loaded.params, images), atol=1e-6)
  written, theirs = (load_file(f / 'model.safetensors') for f in (tmp_path / 'out', HUB / name))
  theirs.pop('embeddings.mask_token', None)
  # Theirs in another layout: unfused attention (q_proj, k_proj, v_proj); swiglu_align_to's
  # separate fc1_g and fc1_x, where vit_jax writes the packed fc1 of SwiGLUPacked.
  if name not in ('timm_eva02', 'timm_eva02_clip', 'timm_dinov3_swiglu'):
    assert sorted(written) == sorted(theirs)
    chex.assert_trees_all_close(written, theirs)


@pytest.mark.parametrize('name', ['dinov3', 'eva02', 'pe_core', 'rope'])
def test_timms_registry_rotary_architectures_load(name):
  """The folders timm wrote of the registry's own rotary architectures (refused before there
  was a rotary encoding) load with the encoding their architecture names."""
  loaded = formats.load_folder(HUB / 'refused' / name)
  assert loaded.model.rope and loaded.model.model_name == json.loads(
      (HUB / 'refused' / name / 'config.json').read_text())['architecture']


def test_a_rotary_model_is_not_exported_as_a_class_without_one(tmp_path):
  """transformers' ViT classes have no rotary encoding: refused in one line naming timm."""
  model, params = tiny(rope='axial', posemb='none', pool='gap', class_token=False)
  with pytest.raises(errors.CheckpointError, match=r"transformers cannot hold .*: rope='axial' "
                     r"\(DINOv3ViTModel's: 'dinov3' with the half layout\)\. Export it as "
                     "format='timm'"):
    formats.export(model, params, tmp_path / 'folder', 'transformers')


@pytest.mark.parametrize('options', [dict(rope='axial'), dict(rope='mixed', posemb='none'),
                                     dict(rope="axial(xy=True, offset=1.0)", key_bias=False)])
def test_a_rotary_model_exported_as_npz_loads_back_rotary(options, tmp_path):
  """A .npz file has no array for a rotary encoding: its options go beside the arrays, and
  the file loads back as the model it was, with the same outputs."""
  model, params = tiny(**options)
  formats.export(model, params, tmp_path / 'rope.npz', 'npz')
  back = formats.load(str(tmp_path / 'rope.npz'))
  assert back.model.rope == model.rope and back.model.posemb == model.posemb
  images = np.random.RandomState(0).uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
  chex.assert_trees_all_close(outputs(back.model, back.params, images),
                              outputs(model, params, images), atol=1e-6)


# SigLIP 2's NaFlex checkpoints (make_naflex_fixtures.py: written by transformers and timm):
# what each is read as, and its library's preprocessing as vit_jax's naflex op.
NAFLEX = {
    'hf_siglip2_cls': (dict(pool='gap', has_class_token=False, num_classes=5,
                            activation='gelu_tanh', image_size=(32, 32)),
                       preprocess.EvalSpec('naflex', method='pil_bilinear', patch_size=8,
                                           max_num_patches=20)),
    'hf_siglip2_vision': (dict(pool='map', has_class_token=False, num_classes=None),
                          preprocess.EvalSpec('naflex', method='pil_bilinear', patch_size=8,
                                              max_num_patches=24,
                                              mean=(0.485, 0.456, 0.406),
                                              std=(0.229, 0.224, 0.225))),
    # Siglip2Model (image and text towers): its image tower, get_image_features.
    'hf_siglip2_model': (dict(pool='map', has_class_token=False, num_classes=None),
                         preprocess.EvalSpec('naflex', method='pil_bilinear', patch_size=8,
                                             max_num_patches=20)),
    'timm_naflex_siglip': (dict(pool='map', has_class_token=False, num_classes=5,
                                activation='gelu_tanh', prefix_posemb=False),
                           preprocess.EvalSpec('naflex', method='pil_bicubic', patch_size=8,
                                               max_num_patches=25)),
}


@pytest.fixture(scope='module')
def naflex_reference():
  return np.load(HUB / 'naflex_logits.npz')


def _sequence(reference, name):
  return naflex.PatchSequence(*(reference[f'{name}/{k}'] for k in
                                ('patches', 'coords', 'mask', 'grid')))


@pytest.mark.parametrize('name', sorted(NAFLEX))
def test_naflex_fixtures_load_with_their_librarys_preprocessing(name, naflex_reference):
  """Each SigLIP 2 folder loads as the ViT it is, with its processor's settings as a naflex
  preprocessing that cuts the library's own patches from the PNGs."""
  options, spec = NAFLEX[name]
  loaded = formats.load_folder(HUB / name)
  for key, value in options.items():
    assert getattr(loaded.model, key) == value, key
  assert loaded.preprocessing == spec
  pipeline = preprocess.parse(spec.spec(None))
  images = [(HUB.parent / 'preprocess' / 'images' / f'{n}.png').read_bytes()
            for n in naflex_reference['images']]
  cut = [pipeline(image, None) for image in images]
  for key, theirs in (('patch_mask', 'mask'), ('patch_grid', 'grid'), ('patch_coords', 'coords')):
    np.testing.assert_array_equal(np.stack([c[key] for c in cut]),
                                  naflex_reference[f'{name}/{theirs}'], err_msg=key)
  # timm's resize is PIL's, as the naflex op's; transformers' default processor resizes with
  # torchvision, a few pixels one intensity level off (test_preprocess.py).
  level = 0 if name.startswith('timm') else 1 / (255 * min(spec.std))
  diff = np.abs(np.stack([c['image'] for c in cut]) - naflex_reference[f'{name}/patches'])
  assert diff.max() <= level + 1e-5 and (diff > 1e-5).mean() < 0.05, diff.max()


@pytest.mark.slow  # One compile per folder (test_predict.py runs one in the fast tier).
@pytest.mark.parametrize('name', sorted(NAFLEX))
def test_naflex_fixtures_give_their_library_outputs_on_its_patches(name, naflex_reference):
  """On the library's own patch sequences, the library's outputs to 1e-5 (the position
  embeddings resized per image to grids of 4 x 6 to 6 x 3 from a 4 x 4 table, up and down,
  the padding masked out of attention and the pools)."""
  loaded = formats.load_folder(HUB / name)
  want = naflex_reference[f'{name}/logits']
  got = jax.jit(loaded.model.apply)({'params': loaded.params}, _sequence(naflex_reference, name))
  assert np.abs(np.asarray(got) - want).max() / np.abs(want).max() < 1e-5


# (folder, format) -> what the export is, by its library's names.
NAFLEX_EXPORTS = {
    ('hf_siglip2_cls', 'transformers'): 'Siglip2ForImageClassification',
    ('hf_siglip2_vision', 'transformers'): 'Siglip2VisionModel',
    ('timm_naflex_siglip', 'timm'): 'naflexvit_base_patch16_siglip',
    ('hf_siglip2_cls', 'timm'): 'naflexvit_base_patch16_siglip',
    ('hf_siglip2_vision', 'timm'): 'naflexvit_base_patch16_siglip',
    ('hf_siglip2_model', 'transformers'): 'Siglip2VisionModel',  # Its image tower.
}


@pytest.mark.parametrize('name, library', sorted(NAFLEX_EXPORTS))
def test_naflex_exports_are_what_their_library_wrote_and_load_back(name, library, tmp_path):
  """An export of a loaded SigLIP 2 folder: to its own library, the tensors it wrote (less
  Siglip2ForImageClassification's unused MAP head) and the processor settings; across, timm's
  NaFlexVit; read back, the same preprocessing, class names and parameters. (timm and
  transformers load these exports with the same outputs: check_naflex_exports.py, 0 to 1e-6.)"""
  loaded = checkpoints.load(str(HUB / name))
  out = tmp_path / 'export'
  checkpoints.export(loaded, out, library)
  config = json.loads((out / 'config.json').read_text())
  assert (config.get('architecture') or config['architectures'][0]) == NAFLEX_EXPORTS[
      name, library]
  if library == name.split('_')[0].replace('hf', 'transformers'):
    theirs = load_file(HUB / name / 'model.safetensors')
    if name == 'hf_siglip2_model':  # Its image tower, as Siglip2VisionModel names it.
      theirs = {k.removeprefix('vision_model.'): v for k, v in theirs.items()
                if k.startswith('vision_model.')}
    ours = load_file(out / 'model.safetensors')
    assert set(ours) == {k for k in theirs if not (name == 'hf_siglip2_cls' and '.head.' in k)}
    for key, value in ours.items():
      np.testing.assert_allclose(value, theirs[key], rtol=1e-6, err_msg=key)
  if library == 'transformers':
    processor = json.loads((out / 'preprocessor_config.json').read_text())
    original = json.loads((HUB / name / 'preprocessor_config.json').read_text())
    assert {k: processor[k] for k in original} == original
  back = checkpoints.load(str(out))
  assert back.preprocessing == loaded.preprocessing
  assert back.class_names == loaded.class_names
  assert back.model.pool == loaded.model.pool and back.model.grid == loaded.model.grid
  chex.assert_trees_all_close(back.params, loaded.params, rtol=1e-6)


@pytest.mark.parametrize('model_args, what', [
    (dict(pos_embed_antialias=False), 'pos_embed_antialias=False'),
    (dict(pos_embed_use_grid_sample=True), 'pos_embed_use_grid_sample=True'),
    (dict(pos_embed_interp_mode='bicubic'), "pos_embed_interp_mode='bicubic'"),
    (dict(rope_type='axial'), "rope_type='axial' (NaFlex rotary positions)")])
def test_a_naflexvit_that_computes_otherwise_is_refused_naming_it(model_args, what, tmp_path):
  """A NaFlexVit whose position embeddings are resized otherwise than vit_jax's naflex path
  resizes them, or that has no option here, is refused by the field, never loaded."""
  folder = tmp_path / 'naflex'
  shutil.copytree(HUB / 'timm_naflex_siglip', folder)
  config = json.loads((folder / 'config.json').read_text())
  config['model_args'].update(model_args)
  (folder / 'config.json').write_text(json.dumps(config))
  with pytest.raises(errors.CheckpointMismatchError,
                     match=re.escape(f"timm's naflexvit_base_patch16_siglip with {what}")):
    formats.load_folder(folder)


def test_a_siglip2_processor_of_another_patch_size_is_refused(tmp_path):
  folder = tmp_path / 'siglip2'
  shutil.copytree(HUB / 'hf_siglip2_cls', folder)
  processor = json.loads((folder / 'preprocessor_config.json').read_text())
  (folder / 'preprocessor_config.json').write_text(json.dumps(dict(processor, patch_size=16)))
  with pytest.raises(errors.CheckpointError, match=r"patch_size=16, but the model's patches "
                     r'are 8 px'):
    formats.load_folder(folder)


@pytest.mark.parametrize('name, options, what', [
    ('timm_naflex_siglip', {}, "pool='map' with a classifier \\(Siglip2ForImageClassification "
     "pools the patches' mean\\)"),
    ('hf_siglip2_cls', dict(class_token=True), '1 prefix tokens'),
])
def test_what_siglip2_cannot_hold_is_refused_naming_timm(name, options, what, tmp_path):
  """A NaFlex model SigLIP 2's classes cannot hold: refused in one line that names timm's
  NaFlexVit, which can; nothing written."""
  loaded = checkpoints.load(str(HUB / name))
  model = loaded.model.clone(**options)
  with pytest.raises(errors.CheckpointError, match=f"^transformers cannot hold .*{what}.*"
                     "format='timm'"):
    formats.export(model, loaded.params, tmp_path / 'out', 'transformers',
                   preprocessing=loaded.preprocessing)
  assert not list(tmp_path.iterdir())
