"""What the TPU compiler says, computed in a process of its own for the tests.

libtpu, once loaded into a process to compile for a TPU topology, breaks jax's profiler
there (``jax.profiler.start_trace`` segfaults), so the tests that compile for a TPU run
this file in a fresh Python (``probe``) and read the one JSON line it prints.

    python tests/tpu_probe.py report v3-8 '{"model.dtype": "bfloat16"}'
"""

import functools
import json
import os
import pathlib
import subprocess
import sys


@functools.cache
def probe(*args: str) -> dict:
  """Runs this file with ``args`` in a fresh Python on 8 CPU devices; its JSON answer (asked
  once a session: the tests that ask the same question share the compile)."""
  from runs import env

  here = pathlib.Path(__file__).resolve()
  environ = {**env(8), 'PYTHONPATH': os.pathsep.join(map(str, here.parents[:2]))}
  environ.pop('JAX_COMPILATION_CACHE_DIR', None)  # Programs for TPUs: compiled as users do.
  done = subprocess.run([sys.executable, str(here), *args], capture_output=True, text=True,
                        timeout=900, cwd=here.parents[1], env=environ)
  lines = [ln for ln in done.stdout.splitlines() if ln.startswith('{')]
  if done.returncode or not lines:
    raise RuntimeError(f'tpu_probe {args} failed ({done.returncode}):\n{done.stderr[-3000:]}')
  return json.loads(lines[-1])


def aot_report(topology: str, overrides: str) -> dict:
  """``planner.report`` of the tiny recipe with ``overrides``, alone."""
  from vit_jax.tools import planner

  from runs import tiny_config

  return {'report': planner.report(tiny_config(**json.loads(overrides)), topology)}


def report(topology: str, overrides: str) -> dict:
  """``planner.report`` of the tiny recipe, and the numbers of the train step that vit_jax.training
  builds, compiled here independently of aot."""
  import jax
  import jax.numpy as jnp

  from vit_jax.base import accelerators, sharding
  from vit_jax.tools import planner
  from vit_jax.training import plan as plan_lib

  from runs import tiny_config

  config = tiny_config(**json.loads(overrides))
  result = planner.report(config, topology)
  tpu = accelerators.tpu_slice(topology)
  plan = plan_lib.validate(config, devices=tpu.compile_devices(), num_train_examples=1000)
  state, shardings = plan.train_state(abstract=True)
  step = plan.train_step(shardings)
  batch = {k: jax.ShapeDtypeStruct(v, jnp.float32, sharding=sharding.batch_sharding(plan.mesh))
           for k, v in {'image': (config.batch_size, *plan.model.image_size, 3),
                        # No classes (masked patch prediction): the loader's (n, 1) labels.
                        'label': (config.batch_size, plan.num_classes or 1)}.items()}
  if not result['fits']:
    return {'report': result}
  compiled = step.lower(state, batch).compile()
  memory = compiled.memory_analysis()
  return {'report': result,
          'hbm_bytes_per_device': (memory.argument_size_in_bytes + memory.output_size_in_bytes
                                   - memory.alias_size_in_bytes + memory.temp_size_in_bytes),
          'step_seconds': compiled.cost_analysis()['optimal_seconds'],
          'train_flops_per_image': 3 * plan.model.forward_flops(),
          'chips': tpu.chips, 'hbm_per_device': tpu.hbm_per_device,
          'peak_flops_per_device': tpu.peak_flops_per_device}


def devices(name: str) -> dict:
  from vit_jax.base import accelerators

  found = accelerators.tpu_slice(name).compile_devices()
  return {'count': len(found), 'kinds': sorted({d.device_kind for d in found})}


def lowered_for_cpu() -> dict:
  """A program compiled for a TPU from this CPU process: which branch it took."""
  import jax
  import jax.numpy as jnp

  from vit_jax.base import accelerators, cpu

  device = accelerators.tpu_slice('v3-8').compile_devices()[:1]
  mesh = jax.make_mesh((1,), ('x',), devices=device)
  arg = jax.ShapeDtypeStruct((4,), jnp.float32, sharding=jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec()))
  f = cpu.lowered_for_cpu(lambda x: x * 3., lambda x: x * 5.)
  text = jax.jit(f).lower(arg).compile().as_text()
  return {'cpu_branch': 'constant(3)' in text, 'other_branch': 'constant(5)' in text}


def tpu_attention() -> dict:
  """``benchmarks.tpu_attention.measure`` of the einsum and splash attention, 130 tokens,
  on one v5p device."""
  from benchmarks import tpu_attention as attention
  from vit_jax.base import accelerators

  device = accelerators.tpu_slice('v5p-8').compile_devices()[0]
  return {kind: attention.measure(kind, device, 2, 2, 130, 64) for kind in ('einsum', 'splash')}


if __name__ == '__main__':
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  command, *args = sys.argv[1:]
  print(json.dumps({'report': report, 'aot': aot_report, 'devices': devices,
                    'lowered_for_cpu': lowered_for_cpu,
                    'tpu_attention': tpu_attention}[command](*args)))
