"""Shared helpers for the tests that train: a tiny recipe, reading a run's results."""

import importlib.util
import json
import os
import pathlib
import sys

import ml_collections

from vit_jax.checkpoints.run import manager as manager_lib
from vit_jax.training import plan as plan_lib

ROOT = pathlib.Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / 'configs' / 'quickstart.py'
TINY_MODEL = dict(name='ti16', image_size=16, patch_size=4, hidden_size=32, mlp_dim=64,
                  num_heads=4, num_layers=2, pool='gap')
# configs/quickstart.py with a smaller model and a short run.
TINY = {'model.hidden_size': 32, 'model.mlp_dim': 64, 'model.num_layers': 2,
        'batch_size': 64, 'eval_batch_size': 64, 'total_steps': 20,
        'schedule.warmup_steps': 5, 'log_every_steps': 5, 'eval_every_steps': 0,
        'checkpoint_every_steps': 10, 'keep_checkpoints': 5,
        # The state stored split over the devices, as on TPUs and GPUs (CPUs default to not).
        'mesh.shard_state': True,
        # quickstart's few-shot evaluator removed: tests/test_fewshot.py tests it.
        'evals.fewshot': None}
# The run of the shared ``tiny_run`` fixture (conftest.py).
TINY_RUN = {'model.pool': 'token', 'total_steps': 10, 'checkpoint_every_steps': 5}


def tiny_config(**overrides) -> ml_collections.ConfigDict:
  """The tiny recipe as a ConfigDict, with dotted-key overrides."""
  spec = importlib.util.spec_from_file_location('quickstart', QUICKSTART)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.update_from_flattened_dict({**TINY, **overrides})
  return config


def main_command(workdir, **overrides) -> list[str]:
  """The `python -m vit_jax.main` command line of the same tiny recipe."""
  return [sys.executable, '-m', 'vit_jax.main', f'--config={QUICKSTART}',
          f'--workdir={workdir}'] + [f'--config.{k}={v}' for k, v in {**TINY, **overrides}.items()]


def local_launch_command(workdir, **overrides) -> list[str]:
  """launch/local.sh's command line of the same tiny recipe: 2 processes x 4 CPU devices."""
  flags = [f'--config.{k}={v}' for k, v in {**TINY, **overrides}.items()]
  return [str(ROOT / 'launch' / 'local.sh'), f'--workdir={workdir}', f'--config={QUICKSTART}',
          '--num-processes=2', '--cpu-devices=4', f'--python={sys.executable}', '--', *flags]


def env(devices: int = 8) -> dict[str, str]:
  """The environment of a subprocess run on ``devices`` simulated CPU devices."""
  return {**os.environ, 'XLA_FLAGS': f'--xla_force_host_platform_device_count={devices}',
          'JAX_PLATFORMS': 'cpu', 'JAX_CPU_COLLECTIVES_IMPLEMENTATION': 'gloo',
          'TF_CPP_MIN_LOG_LEVEL': '3'}


def read_metrics(workdir):
  return [json.loads(line) for line in (pathlib.Path(workdir) / 'metrics.jsonl').open()]


def abstract_state(config):
  """The train state of ``config`` as ShapeDtypeStructs with shardings: a restore's target."""
  plan = plan_lib.validate(config)
  state, shardings = plan.train_state()
  return manager_lib.abstract_like(state, shardings)


def restore_state(workdir, config, step=None):
  """The train state of a run's checkpoint (the latest by default), verified."""
  manager = manager_lib.make_manager(str(workdir), every_steps=1, keep=5)
  try:
    return manager_lib.restore(manager, abstract_state(config), step)
  finally:
    manager.close()


def hub_cache(cache, repo_id, folder, commit='0123456789abcdef0123456789abcdef01234567'):
  """``folder``'s files as ``repo_id`` in a Hugging Face cache at ``cache`` (HF_HUB_CACHE),
  laid out as huggingface_hub writes it: ``models--ORG--NAME/blobs/SHA256``, ``refs/main``
  (the commit), ``snapshots/COMMIT/FILE`` (relative links to the blobs)."""
  import hashlib

  repo = pathlib.Path(cache) / ('models--' + repo_id.replace('/', '--'))
  snapshot = repo / 'snapshots' / commit
  for sub in (repo / 'blobs', repo / 'refs', snapshot):
    sub.mkdir(parents=True, exist_ok=True)
  (repo / 'refs' / 'main').write_text(commit)
  for file in sorted(pathlib.Path(folder).iterdir()):
    data = file.read_bytes()
    blob = hashlib.sha256(data).hexdigest()
    (repo / 'blobs' / blob).write_bytes(data)
    (snapshot / file.name).symlink_to(pathlib.Path('..', '..', 'blobs', blob))
  return snapshot


def fill(disk: pathlib.Path, leave: int = 256 << 10) -> None:
  """Fills ``disk`` but for ``leave`` bytes: less than any checkpoint of the tiny run needs."""
  free = os.statvfs(disk)
  (disk / 'filler').write_bytes(b'\0' * (free.f_bavail * free.f_frsize - leave))


def constant_teacher(path, label=0, image_size=32, class_names=(), format='npz') -> str:
  """A classifier of TINY_MODEL's shape and 10 classes at ``image_size`` (a side, or (height,
  width)), written as
  ``format``, that answers ``label`` whatever the image (its head's kernel zero, as
  initialised; its bias one-hot): a teacher for distillation (config.distill.teacher)."""
  import jax
  import numpy as np

  from vit_jax import checkpoints
  from vit_jax.base.sizes import pair
  from vit_jax.models import get_model

  model = get_model(**{**TINY_MODEL, 'image_size': image_size, 'num_classes': 10})
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                          np.zeros((1, *pair(image_size), 3)))['params']
  rng = np.random.default_rng(0)  # Random weights (not initialised: that compiles).
  params = jax.tree.map(lambda x: rng.normal(0, 0.02, x.shape).astype(x.dtype), shapes)
  params['head'] = {'kernel': np.zeros_like(params['head']['kernel']),
                    'bias': 10 * np.eye(10, dtype=np.float32)[label]}
  return checkpoints.export(model, params, path, format, class_names)
