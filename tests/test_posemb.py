"""vit_jax.models.posemb: the rotary specs, the coordinates and rotations of each kind, and the
lowered train steps, unchanged where no new option is on. The kinds' outputs against timm's
and transformers' own are in test_backbones.py (the rotary fixtures)."""

import json
import pathlib
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.models import get_model, posemb
from vit_jax.models.posemb import Rope

DATA = pathlib.Path(__file__).resolve().parent / 'data'


@pytest.mark.parametrize('spec', ['axial', 'dinov3', 'mixed', "axial(temperature=100.0, xy=True)",
                                  "axial(xy=True, offset=1.0, ref_grid=(24, 24))",
                                  "dinov3(layout='interleaved')"])
def test_a_spec_reads_back_from_its_string(spec):
  rope = Rope.parse(spec)
  assert Rope.parse(str(rope)) == rope
  assert str(rope) == spec.replace(' ', '').replace(',', ', ')


@pytest.mark.parametrize('spec, message', [
    ('spiral', "rope kind 'spiral' is not one of"),
    ('axial(speed=2)', "unknown setting 'speed'"),
    ('axial(100)', 'settings are name=value pairs'),
    ("mixed(layout='half')", "'mixed' rotates interleaved pairs"),
    ('dinov3(ref_grid=(16, 16))', "ref_grid scales 'axial' coordinates"),
])
def test_a_wrong_spec_is_refused_naming_what_is_wrong(spec, message):
  with pytest.raises(ValueError, match=message):
    Rope.parse(spec)


def test_a_model_refuses_a_head_width_rotary_embeddings_cannot_turn():
  with pytest.raises(ValueError, match='head_dim divisible by 4, got 6'):
    get_model('ti16', num_classes=2, hidden_size=12, num_heads=2, rope='axial')


def test_coordinates_of_each_kind():
  """'axial': indices (+ offset, scaled to ``ref_grid``); 'dinov3': patch centres in [-1, 1];
  ``xy`` puts the column first."""
  rows, cols, grid = posemb.grid_positions((2, 4))
  chex.assert_trees_all_close(posemb.coordinates(Rope('axial'), rows, cols, grid)[:5],
                              np.array([[0, 0], [0, 1], [0, 2], [0, 3], [1, 0]], np.float32))
  scaled = posemb.coordinates(Rope('axial', offset=1., ref_grid=(4, 8), xy=True), rows, cols, grid)
  chex.assert_trees_all_close(scaled[5], np.array([(1 + 1) * 2, (1 + 1) * 2], np.float32))
  centred = posemb.coordinates(Rope('dinov3'), rows, cols, grid)
  chex.assert_trees_all_close(centred[0], np.array([-0.5, -0.75], np.float32))
  chex.assert_trees_all_close(centred[-1], np.array([0.5, 0.75], np.float32))
  # One grid per image: each patch's own (row, column) and its image's grid.
  per_image = posemb.coordinates(Rope('dinov3'), rows[None], cols[None], np.array([[2, 4]]))
  chex.assert_trees_all_close(per_image[0], centred)


@pytest.mark.parametrize('layout', ['interleaved', 'half'])
def test_rotation_turns_each_pair_by_its_angle_and_keeps_norms(layout):
  """Pairs (2k, 2k+1) interleaved, (k, k + D/2) half: each turned by its angle; a rotation by
  a then b is a rotation by a + b."""
  x = jax.random.normal(jax.random.key(0), (3, 8))
  a, b = jax.random.uniform(jax.random.key(1), (2, 3, 4), maxval=6.)
  y = posemb.rotate(x, a, layout)
  pairs = (lambda t: (t[..., 0::2], t[..., 1::2])) if layout == 'interleaved' else (
      lambda t: jnp.split(t, 2, -1))
  (x0, x1), (y0, y1) = pairs(x), pairs(y)
  chex.assert_trees_all_close(y0, x0 * jnp.cos(a) - x1 * jnp.sin(a), atol=1e-6)
  chex.assert_trees_all_close(y1, x1 * jnp.cos(a) + x0 * jnp.sin(a), atol=1e-6)
  chex.assert_trees_all_close(posemb.rotate(y, b, layout), posemb.rotate(x, a + b, layout),
                              atol=1e-5)


def test_attention_scores_depend_only_on_the_patches_offset():
  """RoPE's point: a query and a key turned by their coordinates score by their difference,
  so shifting every patch by the same offset changes no score; the prefix tokens are not
  turned."""
  q, k = jax.random.normal(jax.random.key(2), (2, 1, 7, 2, 16))
  coords = jnp.asarray(np.random.RandomState(0).uniform(0, 9, (6, 2)), jnp.float32)
  module = None  # A fixed kind learns nothing.
  score = lambda c: jnp.einsum('bthd,bshd->bhts', *posemb.apply_rope(module, Rope('axial'), q, k,
                                                                      c, prefix=1))
  patches = lambda c: score(c)[..., 1:, 1:]  # Between patches; a prefix token is not turned.
  chex.assert_trees_all_close(patches(coords), patches(coords + 3.25), atol=2e-4)
  turned_q, _ = posemb.apply_rope(module, Rope('axial'), q, k, coords, prefix=1)
  chex.assert_trees_all_equal(turned_q[:, :1], q[:, :1])
  assert not np.allclose(turned_q[:, 1:], q[:, 1:])


def test_a_rotary_only_model_takes_any_size_its_patches_tile():
  """Built for 32x32, applied at 24x40: what the model built for 24x40 computes; a size the
  patches do not tile, or a model with position embeddings at another size, is refused."""
  kw = dict(num_classes=3, hidden_size=32, num_heads=2, mlp_dim=64, num_layers=2, patch_size=8,
            rope='dinov3', posemb='none', pool='gap', class_token=False)
  square, wide = (get_model('ti16', image_size=s, **kw) for s in (32, (24, 40)))
  params = square.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)))['params']
  x = jax.random.uniform(jax.random.key(1), (2, 24, 40, 3), minval=-1, maxval=1)
  chex.assert_trees_all_close(square.apply({'params': params}, x),
                              wide.apply({'params': params}, x), atol=1e-6)
  with pytest.raises(ValueError, match=r'expects NHWC images of shape \(batch, 32, 32, 3\)'):
    square.apply({'params': params}, x[:, :20])
  learned = get_model('ti16', image_size=32, **dict(kw, posemb='learn'))
  with pytest.raises(ValueError, match=r'expects NHWC images of shape \(batch, 32, 32, 3\)'):
    learned.apply(learned.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3))), x)


def test_lowered_train_steps_are_unchanged_where_the_new_options_are_off():
  """The train step of each option mix in tests/data/lowered/steps.py lowers to the text it
  lowered to before the position encodings moved here (steps.json), hash for hash."""
  golden = json.loads((DATA / 'lowered' / 'steps.json').read_text())
  sys.path.insert(0, str(DATA / 'lowered'))
  import steps

  if steps.versions() != golden['versions']:
    pytest.skip(f'steps.json was lowered with {golden["versions"]}, this is {steps.versions()}: '
                'lower them again at the commit it names to compare')
  assert steps.lowered_hashes() == golden['steps']
