"""vit_jax.training.divergence on its own: which metrics make a spike, and how many rewinds a
run may make (its record read back by a restarted run). The loop's use of it, with real NaN
batches and kill -9, is tests/test_faults.py's."""

import dataclasses
import json
import math

import jax.numpy as jnp
import optax
import pytest

from vit_jax.base import errors
from vit_jax.checkpoints.run import manager as manager_lib
from vit_jax.training import divergence

from runs import tiny_config


def step_metrics(loss: float, grad_norm: float) -> dict[str, jnp.ndarray]:
  """What the train step returns, as device scalars."""
  return {'loss': jnp.float32(loss), 'grad_norm': jnp.float32(grad_norm),
          'learning_rate': jnp.float32(1e-3)}


def test_a_non_finite_gradient_norm_is_a_spike_though_the_loss_is_finite():
  """Gradients of 1e20, finite, whose norm (the step's optax.tree.norm) overflows float32,
  under a finite loss: caught at their step, as a non-finite loss is (or a NaN norm)."""
  overflowing = float(optax.tree.norm({'w': jnp.full(4, 1e20, jnp.float32)}))
  assert overflowing == math.inf
  host = divergence.check([(1, step_metrics(2.3, 1.5)), (2, step_metrics(2.2, 1e30))])
  assert [float(m['loss']) for m in host] == pytest.approx([2.3, 2.2])
  for grad_norm in (overflowing, math.nan):
    with pytest.raises(divergence.Spike) as e:
      divergence.check([(1, step_metrics(2.3, 1.5)), (2, step_metrics(2.2, grad_norm)),
                        (3, step_metrics(math.nan, math.nan))])
    assert (e.value.step, e.value.what) == (2, f'non-finite gradient norm {grad_norm}')
  with pytest.raises(divergence.Spike) as e:
    divergence.check([(4, step_metrics(math.inf, 1.5))])
  assert (e.value.step, e.value.what) == (4, 'non-finite loss inf')


def test_rewinds_stop_at_max_rewinds_counting_those_recorded_before_a_restart(tmp_path):
  """max_rewinds=2: two spikes rewind to the good checkpoint at step 10 (each skipping at least
  rewind_skip_batches, and the spike's batches), the third stops in one line naming the
  limit; a restarted run reads the two from rewinds.json, starts at their offset and stops at
  its first spike; a limit of 3 allows the third."""
  config = tiny_config(on_divergence='rewind', max_rewinds=2, rewind_skip_batches=3)
  manager = manager_lib.make_manager(str(tmp_path), every_steps=1, keep=2)
  try:
    manager_lib.save(manager, 10, {'w': jnp.ones(4)}, force=True)
    guard = divergence.Guard(config, str(tmp_path))
    assert guard.start(10) == 0
    made = [guard.diverged(divergence.Spike(12, 'non-finite loss nan'), manager),
            guard.diverged(divergence.Spike(16, 'non-finite loss nan'), manager)]
    assert made == [divergence.Rewind(12, 10, 3), divergence.Rewind(16, 10, 9)]
    assert guard.offset == 9
    record = json.loads((tmp_path / divergence.REWINDS_FILE).read_text())
    assert record == [dataclasses.asdict(r) for r in made]
    limit = (r'^The training diverged at step 13: non-finite loss nan, after 2 rewinds '
             r'\(config\.max_rewinds=2; .*/rewinds\.json\)\. Nothing after step 10 was saved: '
             r'.*, or allow more rewinds\.$')
    with pytest.raises(errors.Diverged, match=limit):
      guard.diverged(divergence.Spike(13, 'non-finite loss nan'), manager)
    assert json.loads((tmp_path / divergence.REWINDS_FILE).read_text()) == record

    restarted = divergence.Guard(config, str(tmp_path))
    assert restarted.start(10) == 9
    with pytest.raises(errors.Diverged, match=limit):
      restarted.diverged(divergence.Spike(13, 'non-finite loss nan'), manager)
    config.max_rewinds = 3
    allowed = divergence.Guard(config, str(tmp_path))
    allowed.start(10)
    assert allowed.diverged(divergence.Spike(13, 'non-finite loss nan'),
                            manager) == divergence.Rewind(13, 10, 12)
    assert len(json.loads((tmp_path / divergence.REWINDS_FILE).read_text())) == 3
  finally:
    manager.close()
