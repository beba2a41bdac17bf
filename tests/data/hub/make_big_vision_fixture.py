"""Writes big_vision tensorstore checkpoints (bv_tok/, bv_gap_scan/) and bv_logits.npz here.

Run OUTSIDE the test environment, in a venv with jax==0.10.2, flax==0.12.8, optax,
tensorstore, ml_collections, einops, absl-py and tensorflow-cpu (big_vision/utils.py imports
tensorflow.io.gfile, which its checkpoint writer uses), with a big_vision checkout
(commit 0127fb6b337ee2a27bf4e54dea79cff176527356) named by VIT_JAX_BIG_VISION:

    VIT_JAX_BIG_VISION=/path/to/big_vision \
      python tests/data/hub/make_big_vision_fixture.py [OUT_DIR]

Each checkpoint is a train state as big_vision's trainer (big_vision/train.py) saves it:
{'params', 'opt', 'chrono'} written by big_vision.utils.save_checkpoint_ts through jax's
GlobalAsyncCheckpointManager into `<workdir>/checkpoint.bv-<step:09d>/`, with the pointer
file `<workdir>/checkpoint.bv-LAST`. The parameters are random and perturbed in the style of
tests/data/big_vision (every leaf + 0.2 * N(0, 1)); then 3 training steps of train.py's
update step (its optimizer config from configs/vit_s16_i1k.py: scale_by_adam with bfloat16
mu, gradient clipping, decoupled weight decay, warm-up + cosine) on a fixed random batch,
checkpointing after every step as train.py does with ckpt_steps=1 (the earlier,
non-kept "-tmp" checkpoints are deleted by big_vision's commit callback). bv_logits.npz holds
the logits of the final parameters. See README.md beside this file.
"""

import functools
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.environ['VIT_JAX_BIG_VISION'])

import big_vision.optax as bv_optax  # noqa: E402
import big_vision.utils as u  # noqa: E402
import flax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from big_vision.models import vit  # noqa: E402
from jax.experimental.array_serialization import serialization as array_serial  # noqa: E402

NOISE = 0.2
COMMON = dict(num_classes=5, patch_size=(4, 4), width=16, depth=2, mlp_dim=32, num_heads=2,
              head_zeroinit=False)
# name -> model kwargs besides COMMON
MODELS = {
    'bv_tok': dict(pool_type='tok', rep_size=8),
    'bv_gap_scan': dict(pool_type='gap', scan=True),
}
TOTAL_STEPS = 3
BATCH = 4


def train_config():
  """The optimizer part of big_vision/configs/vit_s16_i1k.py, with a short schedule."""
  c = ml_collections.ConfigDict()
  c.loss = 'softmax_xent'
  c.grad_clip_norm = 1.0
  c.optax_name = 'scale_by_adam'
  c.optax = dict(mu_dtype='bfloat16')
  c.lr = 0.001
  c.wd = 0.0001
  c.schedule = dict(warmup_steps=2, decay_type='cosine')
  return c


def main(out):
  images = jax.random.uniform(jax.random.PRNGKey(0), (2, 16, 24, 3), minval=-1, maxval=1)
  kb = jax.random.split(jax.random.PRNGKey(7), 2)
  batch = {'image': jax.random.uniform(kb[0], (BATCH, 16, 24, 3), minval=-1, maxval=1),
           'labels': jax.nn.one_hot(jax.random.randint(kb[1], (BATCH,), 0, 5), 5)}
  config = train_config()
  results = {'images': np.asarray(images)}

  for i, (name, kw) in enumerate(MODELS.items()):
    model = vit.Model(**COMMON, **kw)
    params = model.init(jax.random.PRNGKey(10 + i), images[:1])['params']
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(110 + i), len(leaves))
    params = treedef.unflatten([x + NOISE * jax.random.normal(k, x.shape, x.dtype)
                                for x, k in zip(leaves, keys, strict=True)])

    # As big_vision/train.py: the optimizer, its state, the update step.
    tx, _ = bv_optax.make(config, params, sched_kw=dict(
        total_steps=TOTAL_STEPS, batch_size=BATCH, data_size=BATCH * TOTAL_STEPS))
    train_state = {'params': params, 'opt': tx.init(params)}

    @functools.partial(jax.jit, donate_argnums=(0,))
    def update_fn(train_state, rng, batch, model=model, tx=tx):
      step_count = bv_optax.get_count(train_state['opt'], jittable=True)
      rng = jax.random.fold_in(rng, step_count)
      rng, rng_model = jax.random.split(rng, 2)

      def loss_fn(params):
        logits, _ = model.apply({'params': params}, batch['image'], train=True,
                                rngs={'dropout': rng_model})
        return getattr(u, config.loss)(logits=logits, labels=batch['labels'])

      params, opt = train_state['params'], train_state['opt']
      _, grads = jax.value_and_grad(loss_fn)(params)
      updates, opt = tx.update(grads, opt, params)
      return {'params': optax.apply_updates(params, updates), 'opt': opt}

    workdir = os.path.join(out, name)
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    save_ckpt_path = os.path.join(workdir, 'checkpoint.bv')
    mngr = array_serial.GlobalAsyncCheckpointManager()
    rng_loop = jax.random.PRNGKey(42)
    for step in range(1, TOTAL_STEPS + 1):
      train_state = update_fn(train_state, rng_loop, batch)
      # train.py: ckpt = {**train_state, 'chrono': u.chrono.save()} (replicated arrays);
      # a fixed chrono (no wall-clock times) keeps the files deterministic.
      chrono = {'accum_program_time': 0.0, 'accum_train_time': 0.0, 'accum_pause_time': 0.0,
                'accum_examples_seen': step * BATCH}
      ckpt = {**train_state, 'chrono': jax.tree.map(jnp.asarray, chrono)}
      u.save_checkpoint_ts(mngr, ckpt, save_ckpt_path, step, keep=step == TOTAL_STEPS)
    mngr.wait_until_finished()
    assert bv_optax.get_count(train_state['opt']) == TOTAL_STEPS

    # Read back with big_vision's own readers.
    loaded = u.load_checkpoint_ts(save_ckpt_path)
    assert sorted(loaded) == ['chrono', 'opt', 'params'], sorted(loaded)
    back = u.load_params(save_ckpt_path)
    jax.tree.map(np.testing.assert_array_equal, back, train_state['params'])
    restored = u.load_checkpoint_ts(save_ckpt_path, tree=jax.tree.map(lambda _: 0, ckpt))
    jax.tree.map(np.testing.assert_array_equal, restored['opt'], train_state['opt'])

    logits, out_ = model.apply({'params': back}, images)
    results[f'{name}/logits'] = np.asarray(logits)
    results[f'{name}/pre_logits'] = np.asarray(out_['pre_logits'])
    results[f'{name}/step'] = np.asarray(TOTAL_STEPS)
    names = [n for n, _ in u.tree_flatten_with_names(ckpt)[0]]
    print(name, sorted(os.listdir(workdir)), len(names), 'arrays', results[f'{name}/logits'][0])

  bv = os.environ['VIT_JAX_BIG_VISION']
  commit = subprocess.run(['git', '-C', bv, 'rev-parse', 'HEAD'], capture_output=True,
                          text=True, check=False).stdout
  results['versions'] = np.array(json.dumps({
      'jax': jax.__version__, 'flax': flax.__version__, 'optax': optax.__version__,
      'tensorflow': md.version('tensorflow-cpu'), 'tensorstore': md.version('tensorstore'),
      'numpy': np.__version__,
      'big_vision': commit.strip() or 'unknown (not a git checkout)'},
      sort_keys=True))
  np.savez(os.path.join(out, 'bv_logits.npz'), **results)
  print('versions', results['versions'])


if __name__ == '__main__':
  jax.config.update('jax_platforms', 'cpu')
  main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
