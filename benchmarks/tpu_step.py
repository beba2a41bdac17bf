r"""The train step on a TPU slice, from the TPU compiler (no TPU needed), against big_vision.

    python -m benchmarks.tpu_step --topology=v3-8 --big_vision=/path/to/big_vision
    python -m benchmarks.tpu_step --topology=v5p-8 --cells=b16:512:384,l16:512:384 \
        --setting=configs/vit_b16_finetune.py:imagenet2012 --set=model.scan=False

Each cell, ``MODEL:BATCH[:IMAGE_SIZE]`` (by default the three of the v3 speed goal: B/16 at
1024, L/16 and H/14 at 256), is compiled as ``vit_jax.tools.aot`` does: the cost model's step
time and the exact HBM per device, in a config's setting (``--setting``, ``--set``,
``--sweep``). ``--depths=A,B`` extrapolates deep cells from two shallow compiles;
``--big_vision=PATH`` (a checkout) adds its ViT in the same step, its state replicated as
big_vision keeps it. Results: results/RESULTS.md ("TPU train step").
"""

from __future__ import annotations

import os
from typing import Any

from absl import flags

from vit_jax.base import paths

_TOPOLOGY = flags.DEFINE_string('topology', 'v3-8', 'A Cloud TPU slice (vit_jax.tools.aot).')
_CELLS = flags.DEFINE_list('cells', ['b16:1024', 'l16:256', 'h14:256'],
                           'MODEL:GLOBAL_BATCH[:IMAGE_SIZE] cells (224 px unless given).')
_SETTING = flags.DEFINE_string('setting', 'configs/vit_b16_i1k.py',
                               'The config whose precision, optimizer and mesh vit_jax runs.')
_SET = flags.DEFINE_multi_string('set', [], 'KEY=VALUE: an override of the setting, e.g. '
                                 'model.scan=False for a fine-tuning config.')
_DEPTH = flags.DEFINE_integer('depth', None, 'Blocks of every model (both implementations): '
                              'shallow cells compile fast, to compare ideas.')
_DEPTHS = flags.DEFINE_list('depths', None, 'A,B: compile every model at A and B blocks and '
                            'extrapolate to its depth (affine in the depth).')
_SWEEP = flags.DEFINE_multi_string('sweep', [], 'KEY=A,B: more vit_jax cells, e.g. '
                                   'model.remat_policy=none,dots.')
_BIG_VISION = paths.DEFINE_path('big_vision', None, 'A big_vision checkout, for its ViT.')
_JSON = paths.DEFINE_path('json', None, 'Write the results here.')

# What a cell takes from the setting: how the model computes, not what it is.
SETTING_MODEL_KEYS = ('dtype', 'param_dtype', 'matmul_dtype', 'scan', 'remat_policy',
                      'attention_impl')


def parse_cell(text: str) -> tuple[str, int, int]:
  """``MODEL:BATCH[:IMAGE_SIZE]`` -> (model, global batch, image size in pixels)."""
  from vit_jax.base import errors

  parts = text.split(':')
  if len(parts) not in (2, 3) or not all(p.isdigit() and int(p) > 0 for p in parts[1:]):
    raise errors.UserError(f'--cells={text} is not MODEL:BATCH[:IMAGE_SIZE] with positive '
                           'integers (e.g. b16:1024 or b16:512:384).')
  return parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else 224


def parse_depths(text: list[str] | None) -> list[int] | None:
  """``--depths=A,B`` -> [A, B]: two different positive block counts."""
  from vit_jax.base import errors

  if text is None:
    return None
  if (len(text) != 2 or not all(t.isdigit() and int(t) > 0 for t in text)
      or text[0] == text[1]):
    raise errors.UserError(f'--depths={",".join(text)} is not two different positive block '
                           'counts (e.g. --depths=2,4).')
  return sorted(int(t) for t in text)


def cell_config(setting: Any, model: str, batch: int, image_size: int = 224,
                depth: int | None = None) -> Any:
  """A cell's config: ``setting``'s precision, optimizer and mesh; the cell's model, image
  size (the position embedding's grid follows it, as when fine-tuning a release file) and
  batch; softmax cross-entropy, no dropout, no pre-logits layer, 1000 classes."""
  from vit_jax import config as config_lib

  return config_lib.complete({
      'model': {'name': model, 'image_size': image_size, 'num_layers': depth,
                **{k: setting.model[k] for k in SETTING_MODEL_KEYS}},
      'dataset': {'name': 'imagenet2012', 'num_classes': 1000},
      'optimizer': setting.optimizer.to_dict(), 'mesh': setting.mesh.to_dict(),
      'loss': 'softmax_xent', 'batch_size': batch, 'eval_batch_size': batch,
      'total_steps': 1000, 'schedule': {'warmup_steps': 100}})


def big_vision_model(path: str, config: Any) -> Any:
  """big_vision's ViT (``benchmarks.big_vision``) of the cell's model, image size,
  depth, scan and remat."""
  from benchmarks import big_vision
  from vit_jax import config as config_lib

  name, options = config_lib.model_options(config.model)
  return big_vision.vit(path, name, options.get('image_size') or 224, options.get('num_layers'),
                        scan=bool(options.get('scan')),
                        remat_policy=options.get('remat_policy') or 'none')


def big_vision_label(setting: Any) -> str:
  """big_vision's cells by what they run: its precision, and its scan and remat."""
  from benchmarks import big_vision

  remat = setting.model.remat_policy or 'none'
  if setting.model.scan:
    remat = f' scan, remat {big_vision.SCAN_REMAT_POLICIES[remat]}'
  else:
    remat = f' remat {remat} a block' if remat != 'none' else ''
  return f'big_vision dtype_mm=bfloat16{remat}'


def mfu(flops_per_image: float | None, batch: int, seconds: float | None,
        devices: list) -> float | None:
  """The model's FLOPs a step at the devices' published bfloat16 peak (None if unknown)."""
  from vit_jax.base import accelerators

  peak = accelerators.peak_bf16_flops(devices[0].device_kind)
  if not (flops_per_image and seconds and peak):
    return None
  return flops_per_image * batch / seconds / (peak * len(devices))


def run_cell(config: Any, devices: list, label: str, model: Any = None) -> dict[str, Any]:
  """Compiles the cell's train step; its time, HBM and MFU (the model's FLOPs at the chip's
  published bfloat16 peak) per the TPU compiler."""
  from vit_jax.tools import planner

  facts = planner.compile_steps(config, devices, 0, only_train=True, model=model)
  train = facts['train']
  seconds, flops = train.get('step_seconds'), facts['train_flops_per_image']
  row = {'cell': label, 'model': config.model.name, 'batch_size': config.batch_size,
         'image_size': config.model.image_size, 'num_layers': config.model.num_layers,
         'fits': train['fits'], 'step_seconds': seconds,
         'hbm_bytes_per_device': train.get('hbm_bytes_per_device') or train.get(
             'required_bytes'), 'mfu': mfu(flops, config.batch_size, seconds, devices),
         'train_flops_per_image': flops,
         'compile_seconds': train['compile_seconds']}
  print_row(row)
  return row


def print_row(row: dict[str, Any]) -> None:
  """A cell's line: its label, step time, HBM per device, MFU and whether it fits."""
  from vit_jax.tools import planner

  util = row['mfu']
  print(f'{row["cell"]:70} {planner.ms(row["step_seconds"]):>10} '
        f'{planner.gib(row["hbm_bytes_per_device"]):>10}{f"  MFU {util:.1%}" if util else ""}'
        f'{"" if row["fits"] else "  does not fit"}', flush=True)


def extrapolate(shallow: list[dict[str, Any]], depth: int, label: str, devices: list,
                hbm_per_device: int) -> dict[str, Any]:
  """A cell's row at ``depth`` blocks from its rows at two other depths: time, HBM and
  FLOPs are a fixed part plus one part a block (an unrolled step repeats the same block)."""
  (a, b), (ra, rb) = (r['num_layers'] for r in shallow), shallow

  def at_depth(key: str) -> float | None:
    if ra[key] is None or rb[key] is None:
      return None
    return ra[key] + (depth - a) * (rb[key] - ra[key]) / (b - a)

  seconds, flops, hbm = (at_depth(k) for k in
                         ('step_seconds', 'train_flops_per_image', 'hbm_bytes_per_device'))
  row = {**ra, 'cell': label, 'num_layers': depth, 'step_seconds': seconds,
         'hbm_bytes_per_device': hbm, 'train_flops_per_image': flops,
         'mfu': mfu(flops, ra['batch_size'], seconds, devices),
         'fits': all(r['fits'] for r in shallow) and hbm is not None and hbm <= hbm_per_device,
         'compile_seconds': sum(r['compile_seconds'] for r in shallow),
         'extrapolated_from': shallow}
  print_row(row)
  return row


def measure(setting: Any, cell: tuple[str, int, int], what: str, tpu: Any, devices: list,
            depth: int | None, depths: list[int] | None,
            big_vision: str | None = None) -> dict[str, Any]:
  """A cell's row, vit_jax's in ``setting`` or (``big_vision``: a checkout) big_vision's, at
  ``depth`` blocks (None: the model's own): compiled, or compiled at ``depths`` and
  extrapolated."""
  from vit_jax.models import registry

  model, batch, pixels = cell

  def compile_at(layers: int | None) -> dict[str, Any]:
    config = cell_config(setting, model, batch, pixels, layers)
    if big_vision:
      config.mesh.shard_state = False  # As big_vision's own step keeps its state.
    blocks = f', {layers} blocks' if layers else ''
    return run_cell(config, devices, f'{model} @ {batch}, {pixels} px{blocks} {what}',
                    big_vision_model(big_vision, config) if big_vision else None)

  if not depths:
    return compile_at(depth)
  depth = depth or registry.model_kwargs(model)['num_layers']
  return extrapolate([compile_at(d) for d in depths], depth,
                     f'{model} @ {batch}, {pixels} px, {depth} blocks from {depths[0]} and '
                     f'{depths[1]} {what}', devices, tpu.hbm_per_device)


def main(argv: list[str]) -> None:
  del argv
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  from benchmarks import big_vision, results
  from vit_jax.base import accelerators, errors
  from vit_jax.config import cli as config_cli

  cells = [parse_cell(c) for c in _CELLS.value]
  bad = [item for item in _SET.value + _SWEEP.value if '=' not in item]
  if bad:
    raise errors.UserError(f'--set or --sweep {bad[0]} is not KEY=VALUE '
                           '(e.g. --set=model.scan=False).')
  depths = parse_depths(_DEPTHS.value)
  if _BIG_VISION.value and (why := big_vision.not_a_checkout(_BIG_VISION.value)):
    raise errors.UserError(why)
  overrides = [tuple(item.split('=', 1)) for item in _SET.value]
  setting = config_cli.load(_SETTING.value, overrides, flag='setting')
  tpu = accelerators.tpu_slice(_TOPOLOGY.value)
  devices = tpu.compile_devices()
  print(f'{tpu.name} ({tpu.topology}), {len(devices)} x {devices[0].device_kind}; step time '
        'from the TPU cost model, HBM per device from the compiled program.')
  name = ' '.join([_SETTING.value, *_SET.value])
  where = {'tpu': tpu, 'devices': devices, 'depth': _DEPTH.value, 'depths': depths}
  rows = []
  for cell in cells:
    rows.append(measure(setting, cell, f'vit_jax ({name})', **where) | {
        'implementation': 'vit_jax'})
    for sweep in _SWEEP.value:
      key, values = sweep.split('=', 1)
      for value in values.split(','):
        swept = config_cli.load(_SETTING.value, [*overrides, (key, value)], flag='setting')
        rows.append(measure(swept, cell, f'vit_jax {key}={value}', **where) | {
            'implementation': 'vit_jax', 'sweep': {key: value}})
    if _BIG_VISION.value:
      rows.append(measure(setting, cell, big_vision_label(setting), **where,
                          big_vision=_BIG_VISION.value) | {'implementation': 'big_vision'})
  if _JSON.value:
    results.write(_JSON.value, 'benchmarks.tpu_step', cpu={}, load=os.getloadavg(),
                  topology=tpu.name, libtpu_topology=tpu.topology, setting=name,
                  depth=_DEPTH.value, depths=depths, cells=rows)


if __name__ == '__main__':
  from vit_jax.base import errors

  errors.run(main)  # Flag mistakes and user errors as one line, exit status 2.
