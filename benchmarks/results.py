"""A benchmark's results: each cell measured in a process of its own, and the JSON file of
the run (what ran, where and when, then the benchmark's own fields).

Standard library only: ``benchmarks.timm_step`` runs in a venv without jax.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any


def run_cell(command: list[str], what: str,
             env: Mapping[str, str] | None = None) -> dict[str, Any]:
  """Runs one cell's process and returns the JSON row it printed last on stdout; raises a
  RuntimeError naming ``what``, with the end of its stderr, where it failed."""
  done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
  lines = [ln for ln in done.stdout.splitlines() if ln.startswith('{')]
  if done.returncode or not lines:
    raise RuntimeError(f'{what} failed (exit {done.returncode}):\n{done.stderr[-4000:]}')
  return json.loads(lines[-1])


def write(path: str, module: str, cpu: dict[str, Any], load: tuple[float, ...],
          **fields: Any) -> None:
  """Writes ``fields`` to ``path`` after the run's command (``python -m module`` and this
  process's arguments), date, host, ``cpu`` (``host_cpu.cpu_info()``) and the load average
  at its start (other work on the machine skews every figure); says so on stdout."""
  result = {'command': ' '.join([f'python -m {module}', *sys.argv[1:]]),
            'date': time.strftime('%Y-%m-%d %H:%M'), 'host': platform.node(), 'cpu': cpu,
            'load_average_at_start': load, **fields}
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, 'w') as f:
    json.dump(result, f, indent=1)
  print(f'wrote {path}')
