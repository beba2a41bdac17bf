"""Writes the rotary-position (RoPE) fixtures in this folder, rope_logits.npz and predict_rope.npz.

Run OUTSIDE the test environment, in the venv of make_fixtures.py (torch==2.13.0 CPU build,
timm==1.0.31, transformers==5.23.0; README.md beside this file says how to build it), from
the repository root:

    python tests/data/hub/make_rope_fixtures.py [OUT_DIR]   # defaults to this folder

As make_backbone_fixtures.py (whose perturbation, labels and torchvision shim it reuses): each
folder is written by the library itself (timm's `save_for_hf`; transformers' `save_pretrained`
of the model and of its image processor), random weights then every parameter + 0.2 * N(0, 1)
(rope.freqs, the learned frequencies of rope_type='mixed', and every LayerNorm included),
fixed seeds, one CPU thread, float32. The timm models are timm's Eva class (eva.py): DINOv3,
EVA-02, Perception Encoder Core and timm's RoPE ViTs; the transformers one DINOv3ViTModel.

Reference outputs go to rope_logits.npz: at the native 32 x 32 (4 x 4 grid of 8-px patches)
and, with timm's `dynamic_img_size=True` (a twin with the same weights where the architecture
does not set it), at 24 x 40 (a 3 x 5 grid). The script checks that timm built the rotary
embedding for the 3 x 5 grid, that the twin gives the saved model's outputs at 32 x 32, and
that each DINOv3ViTModel, its weights renamed into timm's DINOv3 architecture, gives timm's
outputs (both libraries compute one function).

It also writes refused/ folders of Eva options vit_jax refuses by design (float16, as
make_refused_fixtures.py writes its folders) and, in tests/data/preprocess/, predict_rope.npz:
what timm's own eval pipeline (`create_transform(**resolve_data_config(model=...))` + the
model loaded with `local-dir:`) predicts for the PNGs of make_predict_fixtures.py.
README.md beside this file ("Rotary-position fixtures") says what each folder exercises.
"""

import json
import os
import shutil
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_backbone_fixtures  # noqa: E402  (first: make_fixtures' torchvision shim lets timm import)
import make_fixtures  # noqa: E402
import safetensors  # noqa: E402
import timm  # noqa: E402
import timm.data  # noqa: E402
import timm.models  # noqa: E402
import transformers  # noqa: E402
from PIL import Image  # noqa: E402
from transformers import DINOv3ViTConfig, DINOv3ViTImageProcessor, DINOv3ViTModel  # noqa: E402

LABELS = make_fixtures.LABELS
NUM_CLASSES = len(LABELS)
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
CLASSES = dict(num_classes=NUM_CLASSES)

# name -> (timm architecture, create_model kwargs (num_classes included), what it exercises).
# Everything not given here is the architecture's own (eva.py's registry entry).
TIMM = {
    'timm_dinov3': (
        'vit_small_patch16_dinov3_qkvb', dict(TINY, **CLASSES),
        "DINOv3 S/16 (qkv bias): class token + 4 registers, no abs pos embed, rope_type="
        "'dinov3' (centred coordinates in [-1, 1], periods 100 ** (2k / (Dh / 2))), "
        "rope_rotate_half, layer scale (gamma_1/2), EvaAttention (fused qkv weight, q_bias + "
        "v_bias, k bias zero and not saved), exact GELU MLP, LayerNorm eps 1e-5, final norm, "
        "global_pool 'avg' (patch tokens only), no fc_norm; dynamic_img_size is the arch's own"),
    'timm_dinov3_swiglu': (
        'vit_huge_plus_patch16_dinov3',
        dict(TINY, mlp_ratio=2.7, global_pool='token', num_classes=0),
        "DINOv3 H+/16 (no qkv bias): SwiGLU with separate fc1_g / fc1_x (swiglu_align_to=8: "
        "int(32 * 2.7) = 86 padded to 88), SiLU, class-token pool, features only"),
    'timm_eva02': (
        'eva02_base_patch14_224', dict(TINY, **CLASSES),
        "EVA-02 B/14: abs pos embed (class row included) + rope_type 'cat' (interleaved pairs, "
        "index grid scaled to ref_feat_shape (16, 16), temperature 1e4, 'ij'), separate "
        "q_proj (bias) / k_proj (no bias) / v_proj (bias), SwiGLU fc1_g / fc1_x with a "
        "LayerNorm inside (scale_mlp: mlp.norm), avg pool + fc_norm, LayerNorm eps 1e-6"),
    'timm_eva02_tiny': (
        'eva02_tiny_patch14_224', dict(TINY, **CLASSES),
        "EVA-02 Ti/14: as timm_eva02 but fused qkv weight with q_bias / v_bias and the packed "
        "GluMlp (gate_last=False: h = fc1(x), silu(h[:85]) * h[85:]), no scale_mlp"),
    'timm_eva02_clip': (
        'eva02_base_patch16_clip_224', dict(TINY, **CLASSES),
        "EVA-02-CLIP B/16: as timm_eva02 plus scale_attn_inner (attn.norm, a LayerNorm on "
        "the attention output before proj), class-token pool (arch default 'token'), final "
        "norm, no fc_norm"),
    'timm_pe_core': (
        'vit_pe_core_tiny_patch16_384', dict(TINY, **CLASSES),
        "Perception Encoder Core T/16: norm_pre (use_pre_transformer_norm; patch embedding "
        "without bias), abs pos embed (class row) + rope 'cat' with rope_grid_offset=1, 'xy', "
        "ref_feat_shape (24, 24), AttentionRope (fused qkv with bias), global_pool 'map' "
        "(attn_pool: 8 heads of 4 dims, mlp_ratio 4), LayerNorm eps 1e-5"),
    'timm_rope_axial': (
        'vit_small_patch16_rope_224', dict(TINY, **CLASSES),
        "RoPE-Axial ViT-S (naver): class token, no abs pos, rope 'cat' on the index grid "
        "without ref_feat_shape, 'xy', temperature 100, AttentionRope, layer scale, token pool"),
    'timm_rope_mixed': (
        'vit_small_patch16_rope_mixed_224', dict(TINY, **CLASSES),
        "RoPE-Mixed ViT-S: learned frequencies rope.freqs (2, depth, heads, Dh / 2) per block "
        "and head (x and y), 'xy' index grid, interleaved pairs; no abs pos"),
    'timm_rope_ape': (
        'vit_small_patch16_rope_ape_224', dict(TINY, **CLASSES),
        "RoPE-Axial + APE ViT-S: as timm_rope_axial plus an abs pos embed without the class "
        "row (no_embed_class)"),
    'timm_rope_mixed_ape': (
        'vit_small_patch16_rope_mixed_ape_224', dict(TINY, **CLASSES),
        "RoPE-Mixed + APE ViT-S: as timm_rope_mixed plus an abs pos embed without the class row"),
    'timm_rope_reg_gap': (
        'vit_medium_patch16_rope_reg1_gap_256', dict(TINY, **CLASSES),
        "timm SBB ViT-M with RoPE: 1 register, no class token, no abs pos, rope 'cat' with "
        "ref_feat_shape (16, 16), 'ij', EvaAttention (fused, q_bias / v_bias), layer scale, "
        "avg pool + fc_norm, no final norm"),
}
# Families without an absolute position embedding: their rotary embedding alone carries position.
ROPE_ONLY = ('timm_dinov3', 'timm_dinov3_swiglu', 'timm_rope_axial', 'timm_rope_mixed',
             'timm_rope_reg_gap', 'hf_dinov3', 'hf_dinov3_gated')

_HF_COMMON = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=32,
                  patch_size=8, num_register_tokens=4)
# name -> (config, what it exercises). The processor: the library's defaults (ImageNet mean/std,
# bilinear resize, rescale before the resize) at 32 x 32.
HF = {
    'hf_dinov3': (
        DINOv3ViTConfig(**_HF_COMMON, intermediate_size=128),
        "DINOv3ViTModel (ViT-S/B/L-like): class + 4 registers + mask_token, separate q/k/v "
        "projections (query_bias, no key_bias, value_bias), o_proj, layer scale lambda1, exact "
        "GELU MLP up_proj / down_proj, eps 1e-5, rope_theta 100, RoPE computed per input size; "
        "pooler_output = norm(class token)"),
    'hf_dinov3_gated': (
        DINOv3ViTConfig(**_HF_COMMON, intermediate_size=64, use_gated_mlp=True,
                        hidden_act='silu'),
        "DINOv3ViTModel (H+/7B-like): use_gated_mlp (down_proj(silu(gate_proj(x)) * up_proj(x)))"),
}

# Eva options vit_jax refuses by design: folder -> (architecture, kwargs beside REFUSED_TINY).
REFUSED_TINY = dict(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, num_classes=0)
REFUSED = {
    'eva_post_norm': ('eva02_enormous_patch14_clip_224', {}),  # use_post_norm: EvaBlockPostNorm.
    # rope_type='mrope' (Qwen2-VL-style interleaved multimodal RoPE; 'ij' only).
    'eva_mrope': ('vit_small_patch16_rope_224', dict(rope_type='mrope', rope_grid_indexing='ij')),
    # Grouped-query attention: 1 key/value head for 2 query heads (separate q/k/v required).
    'eva_gqa': ('vit_small_patch16_rope_224', dict(qkv_fused=False, num_kv_heads=1)),
    # Sapiens2: GQA, RmsNorm, qk_norm, attention-only layer scale, 8 registers, rope 'dinov3'.
    'sapiens2': ('vit_base_patch16_sapiens2', dict(num_kv_heads=1)),
}

PREDICT_FOLDERS = ('timm_dinov3', 'timm_eva02')
PREDICT_IMAGES = ('wide', 'tall', 'square', 'grey')
SIZE_2 = '24x40'
PREPROCESS = os.path.join(os.path.dirname(HERE), 'preprocess')


def make_inputs():
  """make_fixtures' 32 x 32 images and a non-square 24 x 40 pair (another seed), NHWC and NCHW."""
  base = make_fixtures.make_inputs()
  images = np.random.RandomState(1).uniform(-1, 1, size=(2, 24, 40, 3)).astype(np.float32)
  return {
      'images': base['images'],
      'pixel_values': base['pixel_values'],
      f'images_{SIZE_2}': images,
      f'pixel_values_{SIZE_2}': np.ascontiguousarray(images.transpose(0, 3, 1, 2)),
  }


def timm_outputs(model, x, results, key, suffix=''):
  """forward_features (all tokens after the final norm), pre_logits and logits of one input."""
  with torch.no_grad():
    feats = model.forward_features(x)
    results[f'{key}/features{suffix}'] = feats.numpy()
    results[f'{key}/pre_logits{suffix}'] = model.forward_head(feats, pre_logits=True).numpy()
    if model.num_classes:
      results[f'{key}/logits{suffix}'] = model.forward_head(feats).numpy()
    np.testing.assert_allclose(
        model(x).numpy(),
        results[f'{key}/logits{suffix}' if model.num_classes else f'{key}/pre_logits{suffix}'],
        rtol=1e-6)


def dynamic_twin(model, arch, kwargs):
  """The model itself if it runs at any size, else the same weights with dynamic_img_size=True."""
  if model.dynamic_img_size:
    return model
  twin = timm.create_model(arch, pretrained=False, dynamic_img_size=True, **kwargs)
  twin.load_state_dict(model.state_dict(), strict=True)
  return twin.eval()


def record_rope_positions(model):
  """Wraps model.rope.get_embed to record how many positions each embedding it returns has."""
  seen = []
  get_embed = model.rope.get_embed

  def recording(*args, **kwargs):
    embed = get_embed(*args, **kwargs)
    seen.append(embed.shape[-2])
    return embed
  model.rope.get_embed = recording
  return seen


def write_timm(out, inputs, results):
  x = torch.from_numpy(inputs['pixel_values'])
  x2 = torch.from_numpy(inputs[f'pixel_values_{SIZE_2}'])
  for i, (name, (arch, kwargs, _)) in enumerate(TIMM.items()):
    torch.manual_seed(9000 + i)
    model = timm.create_model(arch, pretrained=False, **kwargs)
    make_backbone_fixtures.perturb_(model, seed=9500 + i)
    model.eval()
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    timm.models.save_for_hf(model, folder, safe_serialization=True,
                            model_config=dict(label_names=LABELS) if model.num_classes else None)
    timm_outputs(model, x, results, name)
    # The twin that runs at any size (or the model itself): same outputs at the native size,
    # then the 3 x 5 grid, whose rotary embedding timm must build for 15 positions.
    twin = dynamic_twin(model, arch, kwargs)
    check = {}
    timm_outputs(twin, x, check, name)
    for key, value in check.items():
      np.testing.assert_allclose(value, results[key], rtol=1e-5, atol=1e-6, err_msg=key)
    seen = record_rope_positions(twin)
    timm_outputs(twin, x2, results, name, suffix=f'_{SIZE_2}')
    assert seen and set(seen) == {15}, (name, seen)
    results[f'{name}/architecture'] = np.array(arch)
    results[f'{name}/dynamic_img_size'] = np.array(
        'architecture' if model.dynamic_img_size else 'twin')
    cfg = model.pretrained_cfg
    results[f'{name}/preprocess'] = np.array(json.dumps(
        {k: cfg.get(k) for k in make_backbone_fixtures.PREPROCESS_KEYS}, sort_keys=True))
    n = sum(p.numel() for p in model.parameters())
    print(f'{name:20s} {arch:38s} {n:7,d} params', sorted(os.listdir(folder)))


# hf_* folder -> the timm DINOv3 architecture computing the same function (checked below).
HF_AS_TIMM = {
    'hf_dinov3': ('vit_small_patch16_dinov3_qkvb', dict(mlp_ratio=4)),
    'hf_dinov3_gated': ('vit_huge_plus_patch16_dinov3_qkvb', dict(mlp_ratio=2)),
}


def hf_as_timm(name, model):
  """timm's DINOv3 with transformers' DINOv3ViTModel weights, renamed (mask_token dropped)."""
  arch, kwargs = HF_AS_TIMM[name]
  timm_model = timm.create_model(arch, pretrained=False, num_classes=0, global_pool='token',
                                 **dict(TINY, **kwargs))
  sd = model.state_dict()
  out = {'cls_token': sd['embeddings.cls_token'], 'reg_token': sd['embeddings.register_tokens'],
         'patch_embed.proj.weight': sd['embeddings.patch_embeddings.weight'],
         'patch_embed.proj.bias': sd['embeddings.patch_embeddings.bias'],
         'norm.weight': sd['norm.weight'], 'norm.bias': sd['norm.bias']}
  mlp = ({'gate_proj': 'fc1_g', 'up_proj': 'fc1_x', 'down_proj': 'fc2'}
         if model.config.use_gated_mlp else {'up_proj': 'fc1', 'down_proj': 'fc2'})
  for i in range(model.config.num_hidden_layers):
    h, t = f'model.layer.{i}.', f'blocks.{i}.'  # In memory; saved as 'layer.{i}.'
    for norm in ('norm1', 'norm2'):
      for p in ('weight', 'bias'):
        out[f'{t}{norm}.{p}'] = sd[f'{h}{norm}.{p}']
    out[f'{t}attn.qkv.weight'] = torch.cat(
        [sd[f'{h}attention.{x}_proj.weight'] for x in 'qkv'])
    out[f'{t}attn.q_bias'] = sd[f'{h}attention.q_proj.bias']
    out[f'{t}attn.v_bias'] = sd[f'{h}attention.v_proj.bias']
    out[f'{t}attn.proj.weight'] = sd[f'{h}attention.o_proj.weight']
    out[f'{t}attn.proj.bias'] = sd[f'{h}attention.o_proj.bias']
    out[f'{t}gamma_1'] = sd[f'{h}layer_scale1.lambda1']
    out[f'{t}gamma_2'] = sd[f'{h}layer_scale2.lambda1']
    for hf_name, timm_name in mlp.items():
      for p in ('weight', 'bias'):
        out[f'{t}mlp.{timm_name}.{p}'] = sd[f'{h}mlp.{hf_name}.{p}']
  timm_model.load_state_dict(out, strict=True)
  return timm_model.eval()


def arch_of(name):
  return HF_AS_TIMM[name][0]


def write_hf(out, inputs, results):
  for i, (name, (config, _)) in enumerate(HF.items()):
    torch.manual_seed(9100 + i)
    model = DINOv3ViTModel(config)
    make_backbone_fixtures.perturb_(model, seed=9600 + i)
    model.eval()
    folder = os.path.join(out, name)
    shutil.rmtree(folder, ignore_errors=True)
    model.save_pretrained(folder)
    DINOv3ViTImageProcessor(size={'height': 32, 'width': 32}).save_pretrained(folder)
    for suffix, key in (('', 'pixel_values'), (f'_{SIZE_2}', f'pixel_values_{SIZE_2}')):
      with torch.no_grad():
        o = model(pixel_values=torch.from_numpy(inputs[key]))
      results[f'{name}/last_hidden_state{suffix}'] = o.last_hidden_state.numpy()
      results[f'{name}/pooler_output{suffix}'] = o.pooler_output.numpy()
      # The same function as timm's DINOv3 (timm's features = last_hidden_state, its
      # class-token pre_logits = pooler_output): one implementation serves both libraries.
      check = {}
      timm_outputs(hf_as_timm(name, model), torch.from_numpy(inputs[key]), check, 'timm')
      for timm_key, hf_key in (('features', 'last_hidden_state'), ('pre_logits', 'pooler_output')):
        np.testing.assert_allclose(check[f'timm/{timm_key}'], results[f'{name}/{hf_key}{suffix}'],
                                   rtol=1e-5, atol=2e-5, err_msg=f'{name} {hf_key}{suffix}')
        diff = np.abs(check[f'timm/{timm_key}'] - results[f'{name}/{hf_key}{suffix}']).max()
        print(f'{name} {hf_key}{suffix}: timm {arch_of(name)} differs by {diff:.1e}')
    results[f'{name}/architecture'] = np.array(type(model).__name__)
    print(f'{name:20s} {type(model).__name__:38s}', sorted(os.listdir(folder)))


def write_refused(out):
  """Tiny float16 folders of Eva options vit_jax refuses (as make_refused_fixtures.py)."""
  torch.manual_seed(9200)
  for folder, (arch, kwargs) in REFUSED.items():
    model = timm.create_model(arch, pretrained=False, **REFUSED_TINY, **kwargs).half().eval()
    path = os.path.join(out, 'refused', folder)
    shutil.rmtree(path, ignore_errors=True)
    timm.models.save_for_hf(model, path, safe_serialization=True)
    size = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    print(f'refused/{folder:14s} {arch:34s} {size:7,d} bytes')


def write_predict(out, inputs, npz_dir):
  """timm's own eval pipeline on the preprocess PNGs, for the folders in PREDICT_FOLDERS."""
  images = [Image.open(os.path.join(PREPROCESS, 'images', f'{n}.png')).convert('RGB')
            for n in PREDICT_IMAGES]
  result = {'images': np.array(PREDICT_IMAGES), 'versions': np.array(json.dumps(dict(
      torch=torch.__version__, timm=timm.__version__, transformers=transformers.__version__)))}
  for name in PREDICT_FOLDERS:
    model = timm.create_model(f'local-dir:{os.path.join(out, name)}', pretrained=True).eval()
    with torch.no_grad():  # The folder as timm reads it back: the saved model's outputs.
      np.testing.assert_allclose(model(torch.from_numpy(inputs['pixel_values'])).numpy(),
                                 inputs[f'{name}/logits'], rtol=1e-6)
    config = timm.data.resolve_data_config(model=model)
    transform = timm.data.create_transform(**config, is_training=False)
    x = torch.stack([transform(image) for image in images])
    with torch.no_grad():
      probs = torch.softmax(model(x), -1).numpy()
    result[f'{name}/top1'], result[f'{name}/prob'] = probs.argmax(-1), probs.max(-1)
    result[f'{name}/probs'] = probs
    result[f'{name}/data_config'] = np.array(json.dumps(config, sort_keys=True))
    print(name, config, result[f'{name}/top1'], result[f'{name}/prob'])
  np.savez(os.path.join(npz_dir, 'predict_rope.npz'), **result)


def main(out):
  torch.set_num_threads(1)
  torch.use_deterministic_algorithms(True)
  os.makedirs(out, exist_ok=True)
  inputs = make_inputs()
  results = dict(inputs)
  write_timm(out, inputs, results)
  write_hf(out, inputs, results)
  results = {k: (v.astype(np.float32) if v.dtype.kind == 'f' else v) for k, v in results.items()}
  results['versions'] = np.array(json.dumps({
      'torch': torch.__version__, 'timm': timm.__version__,
      'transformers': transformers.__version__, 'safetensors': safetensors.__version__,
      'numpy': np.__version__}, sort_keys=True))
  np.savez(os.path.join(out, 'rope_logits.npz'), **results)
  write_refused(out)
  # predict_rope.npz lives in tests/data/preprocess/ (beside predict.npz), else in OUT_DIR.
  write_predict(out, results, PREPROCESS if os.path.abspath(out) == HERE else out)
  print('versions', results['versions'])


if __name__ == '__main__':
  main(sys.argv[1] if len(sys.argv) > 1 else HERE)
