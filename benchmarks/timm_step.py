r"""timm's ViT training step on this machine: the reference for ``benchmarks.train``.

PyTorch is not a dependency of vit_jax: torch, torchvision and timm go in a venv of their own,
whose Python ``benchmarks.train --timm_python=PYTHON`` runs this file with, as cells of its run.
It also runs alone, from the repository root:

    /tmp/timmenv/bin/python -m benchmarks.timm_step --model=vit_tiny_patch16_224 \
        --autocast=none,bfloat16 --out=/tmp/timm_ti16.json

The step: timm's model in train mode, AdamW, softmax cross-entropy, random images, the median
of ``--steps``; ``--autocast=bfloat16`` is torch's bfloat16 autocast (vit_jax's
``matmul_dtype='bfloat16'``). Where torch sees a CUDA GPU it runs there (``--device``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import resource
import statistics
import sys
import time
from typing import Any

if not __package__:  # Run as a file by another venv's Python: the repository is above it.
  sys.path.append(str(pathlib.Path(__file__).resolve().parents[1]))
from benchmarks import results  # noqa: E402 (standard library only)
from vit_jax.base.cpu import host_cpu  # noqa: E402 (standard library only)

AUTOCASTS = ('none', 'bfloat16')
_TIMM_SIZES = {'ti': 'tiny', 's': 'small', 'b': 'base', 'l': 'large', 'h': 'huge'}


def timm_name(model: str) -> str:
  """timm's name of a vit_jax model: 'ti16' or 'ViT-Ti_16' -> 'vit_tiny_patch16_224'."""
  key = model.strip().lower().replace('/', '_').removeprefix('vit-').replace('_', '')
  m = re.fullmatch(r'(ti|s|b|l|h)(\d+)', key)
  if not m:
    raise ValueError(f'model {model!r}: only the plain ViTs ({", ".join(_TIMM_SIZES)} with a '
                     'patch size, e.g. "ti16") have a timm counterpart here.')
  return f'vit_{_TIMM_SIZES[m.group(1)]}_patch{m.group(2)}_224'


def measure(model_name: str, batch_size: int, image_size: int, autocast: str, steps: int,
            warmup: int, threads: int, device: str = 'auto') -> dict[str, Any]:
  """Times timm's train step in this process, on ``device`` ('auto': CUDA where torch sees
  it, else the CPU); returns one JSON row."""
  try:
    import timm
    import torch
  except ImportError as e:
    raise SystemExit(f'{e}: benchmarks.timm_step needs torch, torchvision and timm, '
                     'which vit_jax does not depend on; install them in a venv of their own '
                     '(see this module\'s docstring).') from None
  if device == 'auto':
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
  torch.set_num_threads(threads)
  torch.manual_seed(0)
  model = timm.create_model(model_name, num_classes=1000, img_size=image_size).to(device)
  model.train()
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
  images = torch.rand(batch_size, 3, image_size, image_size, device=device) * 2 - 1
  labels = torch.randint(0, 1000, (batch_size,), device=device)
  dtype = None if autocast == 'none' else getattr(torch, autocast)

  def step() -> float:
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=dtype, enabled=dtype is not None):
      loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    if device == 'cuda':
      torch.cuda.synchronize()  # The step's time is the GPU's, to its last kernel.
    return loss.item()

  for _ in range(warmup):
    step()
  times = []
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  for _ in range(steps):
    start = time.perf_counter()
    loss = step()
    times.append(time.perf_counter() - start)
  faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
  step_s = statistics.median(times)
  return {
      'timm_model': model_name, 'batch_size': batch_size, 'image_size': image_size,
      'autocast': autocast, 'threads': threads,
      'parameters': sum(p.numel() for p in model.parameters()),
      'step_s_median': step_s, 'step_s_all': times, 'images_per_s': batch_size / step_s,
      'page_faults_per_step': faults / steps, 'loss': loss,
      'max_rss_bytes': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
      'torch': torch.__version__, 'timm': timm.__version__,
      'torch_cpu_capability': torch.backends.cpu.get_cpu_capability(), 'device': device,
      'device_name': torch.cuda.get_device_name() if device == 'cuda' else 'cpu',
      'peak_memory_bytes': torch.cuda.max_memory_allocated() if device == 'cuda' else None,
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--model', default='vit_tiny_patch16_224', help='a timm model name')
  parser.add_argument('--image_size', type=int, default=224)
  parser.add_argument('--batch_size', type=int, default=32)
  parser.add_argument('--autocast', default='none,bfloat16',
                      help='comma-separated: none (float32) and/or bfloat16')
  parser.add_argument('--steps', type=int, default=8)
  parser.add_argument('--warmup', type=int, default=2)
  parser.add_argument('--threads', type=int, default=os.cpu_count())
  parser.add_argument('--device', default='auto', choices=('auto', 'cpu', 'cuda'),
                      help='auto: CUDA where torch sees a GPU, else the CPU')
  parser.add_argument('--out', default='', help='JSON file for the results')
  parser.add_argument('--cell', default='', help='internal: one setting, in this process')
  args = parser.parse_args()
  if args.cell:
    print(json.dumps(measure(args.model, args.batch_size, args.image_size, args.cell,
                             args.steps, args.warmup, args.threads, args.device)))
    return
  settings = args.autocast.split(',')
  for autocast in settings:
    if autocast not in AUTOCASTS:
      parser.error(f'--autocast={autocast!r}: expected a comma-separated list of {AUTOCASTS}.')

  load = os.getloadavg()
  cpu = host_cpu.cpu_info()
  rows = []
  for autocast in settings:  # Each in a process of its own.
    try:
      rows.append(results.run_cell([sys.executable, __file__, *sys.argv[1:],
                                    f'--cell={autocast}'], f'autocast={autocast}'))
    except RuntimeError as e:
      sys.exit(str(e))
  print(f'timm {rows[0]["timm"]}, torch {rows[0]["torch"]}: {args.model}, batch '
        f'{args.batch_size}, on {rows[0]["device_name"]} ({args.threads} CPU threads), '
        f'median of {args.steps} steps.\nCPU: {host_cpu.describe(cpu)}')
  print(f'{"autocast":10}{"step ms":>9}{"img/s":>8}{"host RSS":>10}')
  for r in rows:
    print(f'{r["autocast"]:10}{1e3 * r["step_s_median"]:>9.1f}{r["images_per_s"]:>8.1f}'
          f'{r["max_rss_bytes"] / 2**20:>6.0f} MiB')
  if args.out:
    results.write(args.out, 'benchmarks.timm_step', cpu, load, cells=rows)


if __name__ == '__main__':
  main()
