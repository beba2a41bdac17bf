"""The lowered train steps whose text must not change when a new model option is off.

``python tests/data/lowered/steps.py`` (from the repository root) prints, for each option mix
below, the sha256 of the StableHLO text of the train step as the training loop builds it
(``plan.train_step``), lowered on abstract inputs on one CPU device. ``steps.json`` beside this
file holds them as they were before the position encodings moved into
``vit_jax/models/posemb.py`` (commit af89754), with the jax and flax versions they were
lowered with; ``tests/test_posemb.py`` lowers them again and compares.
"""

from __future__ import annotations

import hashlib
import json
import sys

# Option mixes of the tiny recipe (tests/runs.py): each sets what differs from it.
MIXES = {
    'token_learn': {},
    'gap_sincos2d': {'model.pool': 'gap', 'model.posemb': 'sincos2d'},
    'map_scan_remat': {'model.pool': 'map', 'model.scan': True, 'model.remat_policy': 'dots'},
    'registers_layerscale_gated': {
        'model.num_registers': 2, 'model.layer_scale': 1e-5, 'model.gated_mlp': True,
        'model.activation': 'silu', 'model.prefix_posemb': False, 'model.qk_norm': True},
    'gap_fcnorm_prenorm_dropout': {
        'model.pool': 'gap', 'model.class_token': False, 'model.fc_norm': True,
        'model.pre_norm': True, 'model.dropout_rate': 0.1, 'model.stochastic_depth': 0.1},
    'mpp': {'objective': 'mpp'},
}


def lowered_hashes() -> dict[str, str]:
  """{mix: sha256 of its lowered train step's text}."""
  import jax
  import jax.numpy as jnp

  sys.path.insert(0, 'tests')
  from vit_jax.base import sharding
  from vit_jax.training import plan as plan_lib

  from runs import tiny_config

  out = {}
  for name, overrides in MIXES.items():
    config = tiny_config(**overrides)
    plan = plan_lib.validate(config, devices=jax.devices()[:1], num_train_examples=1000)
    state, shardings = plan.train_state(abstract=True)
    batch = {'image': (config.batch_size, *plan.model.image_size, 3),
             'label': (config.batch_size, plan.num_classes or 1)}
    batch = {k: jax.ShapeDtypeStruct(v, jnp.float32, sharding=sharding.batch_sharding(plan.mesh))
             for k, v in batch.items()}
    text = plan.train_step(shardings).lower(state, batch).as_text()
    out[name] = hashlib.sha256(text.encode()).hexdigest()
  return out


def versions() -> dict[str, str]:
  import flax
  import jax
  return {'jax': jax.__version__, 'flax': flax.__version__}


if __name__ == '__main__':
  print(json.dumps({'versions': versions(), 'steps': lowered_hashes()}, indent=1))
