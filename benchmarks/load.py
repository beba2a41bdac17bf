r"""Loading a timm checkpoint folder: vit_jax's ``load`` against timm's own, on this machine.

    python -m benchmarks.load --timm_python=/work/fixture-venv/bin/python --out=results/load.json

timm writes a ViT-B/16 folder (``save_for_hf``: config.json and a 346 MB model.safetensors,
random weights) once; then each cell runs ``--repeats`` times, each in a process of its own:
vit_jax's ``vit_jax.checkpoints.load(FOLDER)`` (the model, its parameters as numpy arrays,
class names and preprocessing) and timm's ``timm.create_model('local-dir:FOLDER',
pretrained=True)``. A cell times the import of the library, the first load in the process
and a second one (the file in the page cache, the library's one-time set-up done); the table
gives the medians (vit_jax's import: jax and vit_jax.checkpoints). timm runs in the venv of
``--timm_python`` (torch is no dependency of vit_jax), on as many threads as vit_jax's
process may use.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

if not __package__:  # Run as a file by another venv's Python: the repository is above it.
  sys.path.append(str(pathlib.Path(__file__).resolve().parents[1]))
from benchmarks import results  # noqa: E402 (standard library only)
from vit_jax.base.cpu import host_cpu  # noqa: E402 (standard library only)

ARCHITECTURE = 'vit_base_patch16_224'


def cell(kind: str, folder: str) -> dict[str, Any]:
  """One process's times: the import, the first load and a second one (seconds)."""
  start = time.perf_counter()
  if kind == 'vit_jax':
    import jax  # noqa: F401  (what the load needs: vit_jax's own import is lazy)

    from vit_jax import checkpoints
    load = lambda: checkpoints.load(folder)
  else:
    import timm
    import torch
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    load = lambda: timm.create_model('local-dir:' + folder, pretrained=True)
  imported = time.perf_counter()
  load()
  first = time.perf_counter()
  load()
  return dict(cell=kind, import_s=imported - start, first_load_s=first - imported,
              second_load_s=time.perf_counter() - first)


def write_folder(folder: str) -> dict[str, Any]:
  """timm's ViT-B/16 with random weights, saved as timm saves it (in the timm venv)."""
  import timm
  import timm.models
  import torch

  torch.manual_seed(0)
  model = timm.create_model(ARCHITECTURE, pretrained=False)
  timm.models.save_for_hf(model, folder, safe_serialization=True)
  return dict(cell='write', timm=timm.__version__, torch=torch.__version__)


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--timm_python', required=True, help='a Python with torch and timm')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--out', default='', help='JSON file for the results')
  parser.add_argument('--cell', default='', help='internal: vit_jax, timm or write')
  parser.add_argument('--folder', default='', help='internal: the folder')
  args = parser.parse_args(argv)
  if args.cell:
    print(json.dumps(write_folder(args.folder) if args.cell == 'write'
                     else cell(args.cell, args.folder)))
    return
  load = os.getloadavg()
  me = [sys.executable, '-m', 'benchmarks.load', '--timm_python=-']
  theirs = [args.timm_python, str(pathlib.Path(__file__).resolve()), '--timm_python=-']
  with tempfile.TemporaryDirectory() as root:
    folder = os.path.join(root, ARCHITECTURE)
    versions = results.run_cell([*theirs, '--cell=write', f'--folder={folder}'], 'timm write')
    rows = []
    for _ in range(args.repeats):  # Interleaved, so that the machine's drift hits both.
      for kind, command in (('vit_jax', me), ('timm', theirs)):
        rows.append(results.run_cell([*command, f'--cell={kind}', f'--folder={folder}'], kind))
    size = os.path.getsize(os.path.join(folder, 'model.safetensors'))
  print(f'{ARCHITECTURE} (timm {versions["timm"]}, torch {versions["torch"]}), '
        f'model.safetensors {size / 1e6:.0f} MB, {args.repeats} processes each, medians:')
  print(f'{"":10}{"import s":>10}{"1st load s":>12}{"2nd load s":>12}')
  table = {}
  for kind in ('vit_jax', 'timm'):
    mine = [r for r in rows if r['cell'] == kind]
    table[kind] = {k: statistics.median(r[k] for r in mine)
                   for k in ('import_s', 'first_load_s', 'second_load_s')}
    print(f'{kind:10}' + ''.join(f'{table[kind][k]:{w}.2f}' for k, w in
                                 (('import_s', 10), ('first_load_s', 12), ('second_load_s', 12))))
  if args.out:
    results.write(args.out, 'benchmarks.load', host_cpu.cpu_info(), load,
                  architecture=ARCHITECTURE, bytes=size, versions=versions, medians=table,
                  rows=rows)


if __name__ == '__main__':
  main(sys.argv[1:])
