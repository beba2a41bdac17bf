"""Can the hosts feed the chips? The host cores a slice's images/s needs for a config's input.

``check`` divides each host's share of a train step's images/s (``vit_jax.tools.aot``) by the
per-core rate of the config's ``dataset.pp_train``, as ``python -m benchmarks.input --recipes=...``
measured it (``results/input_recipes.json``) or the user gives it (``--host_images_per_core``),
and compares the cores needed with the vCPUs of one host of the generation (``HOSTS``). Mixup
and CutMix are no host work: ``vit_jax.training.mixing`` mixes the global batch in the step.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import re
import types
from typing import Any

from vit_jax.base import accelerators, errors, paths

# Written by ``python -m benchmarks.input --recipes=shipped --out=...`` (RESULTS.md).
RATES_FILE = pathlib.Path(__file__).resolve().parents[2] / 'results' / 'input_recipes.json'


@dataclasses.dataclass(frozen=True)
class Host:
  """One TPU VM (host) of a generation's multi-host slices."""

  chips: int  # TPU chips a host drives.
  vcpus: int | None  # None: not found in the documentation; said so, not guessed.


# v3, v4, v5p: 4 chips a host (v3: 8 TensorCores), 96, 240 and 208 vCPUs (Cloud TPU's
# documentation of each generation's TPU VMs). v5e (docs.cloud.google.com/tpu/docs/v5e, "VM types"):
# ct5lp-hightpu-1t, -4t and -8t VMs hold 1, 4 and 8 chips with 24, 112 and 224 vCPUs, and
# slices of 8 chips or more are 8-chip VMs (its slice table: 4x4, 16 chips, on 2 hosts).
# v6e (docs.cloud.google.com/tpu/docs/v6e): "Chips per host: 8"; the vCPUs of its VMs were
# not found in the documentation searched, so they are unknown here, as v2's are.
HOSTS: dict[str, Host] = {'v2': Host(4, None), 'v3': Host(4, 96), 'v4': Host(4, 240),
                          'v5p': Host(4, 208), 'v5litepod': Host(8, 224), 'v6e': Host(8, None)}
# Slices smaller than a host: a VM of their own size (v5e's 1- and 4-chip VMs).
SMALL_HOSTS: dict[tuple[str, int], Host] = {('v5litepod', 1): Host(1, 24),
                                            ('v5litepod', 4): Host(4, 112)}


def host_of(generation: str, chips: int) -> tuple[int, Host | None]:
  """(hosts in a slice of ``chips`` chips of ``generation``, one host's figures or None)."""
  host = SMALL_HOSTS.get((generation, chips)) or HOSTS.get(generation)
  if host is None:
    return 0, None
  return max(1, math.ceil(chips / host.chips)), host


def pipeline_key(pipeline: str) -> str:
  """The key of a pipeline string in the rates file: the string without whitespace."""
  return re.sub(r'\s+', '', pipeline)


def load_rates(path: str | pathlib.Path = RATES_FILE) -> dict[str, dict[str, Any]]:
  """The measured pipelines by ``pipeline_key`` ({} where the file is absent)."""
  path = pathlib.Path(path)
  if not path.is_file():
    return {}
  return json.loads(path.read_text())['pipelines']


def define_flags() -> types.SimpleNamespace:
  """The flags ``vit_jax.tools.aot`` adds for this check."""
  from absl import flags

  return types.SimpleNamespace(
      per_core=flags.DEFINE_float(
          'host_images_per_core', None, 'Images/s one host core prepares for the config\'s '
          'training pipeline (default: the rate measured in --input_rates for its '
          'dataset.pp_train).'),
      rates=paths.DEFINE_path(
          'input_rates', str(RATES_FILE), 'JSON of per-core input rates (python -m '
          'benchmarks.input --recipes=... --out=...).'))


def check_flags(names: types.SimpleNamespace) -> None:
  """Refuses a per-core rate that is not positive and a rates file given that cannot be read
  (before anything compiles)."""
  value, path = names.per_core.value, names.rates.value
  if value is not None and not value > 0:
    raise errors.UserError(f'--host_images_per_core={value} must be positive (images/s that '
                           'one host core prepares, e.g. 300).')
  if path == str(RATES_FILE) and not RATES_FILE.is_file():
    return  # Not shipped (an installed package): no rates, which the report says.
  try:
    rates = load_rates(path) if pathlib.Path(path).is_file() else None
  except (ValueError, KeyError, TypeError):
    rates = None
  if not isinstance(rates, dict):
    raise errors.UserError(f'--input_rates={path} is not a file of input rates: write one with '
                           'python -m benchmarks.input --recipes=CONFIG --out=FILE.')


@dataclasses.dataclass(frozen=True)
class Feeding:
  """The host side of a slice at a step's images/s."""

  images_per_second: float
  hosts: int
  chips_per_host: int
  vcpus_per_host: int | None
  per_core: float | None  # Images/s one host core prepares; None: not known.
  rate_source: str
  input_workers: int  # Loader threads per process (config.input_workers).

  @property
  def per_host(self) -> float:
    return self.images_per_second / self.hosts

  @property
  def cores_needed(self) -> float | None:
    return self.per_host / self.per_core if self.per_core else None

  @property
  def keeps_up(self) -> bool | None:
    """Whether a host's vCPUs suffice (None: the rate or the vCPUs are not known)."""
    if self.cores_needed is None or self.vcpus_per_host is None:
      return None
    return self.cores_needed <= self.vcpus_per_host


def rate_for(config: Any, rates: dict[str, dict[str, Any]], given: float | None
             ) -> tuple[float | None, str]:
  """(images/s per host core for the config's training pipeline, where it comes from)."""
  if given:
    return given, 'given (--host_images_per_core)'
  entry = rates.get(pipeline_key(config.dataset.pp_train))
  if entry is None:
    return None, 'not measured'
  return entry['images_per_second_per_core'], (
      f'measured: images per CPU-second, the lower of {entry["cores_measured"]} cores, '
      f'{entry["data_name"]}')


def feeding(config: Any, images_per_second: float, generation: str, chips: int,
            rates: dict[str, dict[str, Any]], given: float | None = None) -> Feeding:
  """The host-side figures of a slice of ``chips`` chips at ``images_per_second``."""
  hosts, host = host_of(generation, chips)
  per_core, source = rate_for(config, rates, given)
  return Feeding(images_per_second, hosts or 1, min(host.chips, chips) if host else chips,
                 host and host.vcpus, per_core, source, int(config.input_workers))


def report_lines(f: Feeding, pipeline: str, generation: str, mixes: bool) -> list[str]:
  """The report's lines (labels as ``planner.format_report``'s): hosts, images/s per host,
  cores needed against the host's vCPUs, and a warning where it cannot keep up."""
  lines = [f'{"input pipeline":28}{pipeline}',
           f'{"hosts in the slice":28}{f.hosts:>14}  ({f.chips_per_host} chips per host)',
           f'{"images/s per host":28}{f.per_host:>14,.0f}']
  if mixes:
    lines.append(f'{"mixup/CutMix":28}{"on the chips":>14}  (inside the train step: in its '
                 'time, no host work)')
  vcpus = (f'{f.vcpus_per_host} vCPUs per {generation} host' if f.vcpus_per_host
           else f'the vCPUs of a {generation} host are not known here')
  if f.cores_needed is None:
    lines.append(f'{"host cores needed":28}{"?":>14}  ({vcpus})')
    lines.append('WARNING: no input rate measured for this pipeline: measure it (python -m '
                 'benchmarks.input --recipes=CONFIG --out=FILE, then --input_rates=FILE)'
                 ' or give one (--host_images_per_core=N); whether the hosts keep up is '
                 'not checked.')
    return lines
  lines.append(f'{"host cores needed":28}{f.cores_needed:>14,.1f}  of {vcpus}, at '
               f'{f.per_core:,.0f} images/s per core ({f.rate_source})')
  if f.keeps_up is False:
    most = f.vcpus_per_host * f.per_core
    lines.append(f'WARNING: the hosts cannot keep up: each needs {f.cores_needed:,.0f} cores '
                 f'for {f.per_host:,.0f} images/s but has {f.vcpus_per_host} vCPUs, at most '
                 f'{most:,.0f} images/s ({most / f.per_host:.0%} of the step\'s rate): the '
                 'chips would wait for input. A cheaper pipeline, a bigger model or '
                 'pre-processed data would change that.')
  if f.cores_needed > f.input_workers:
    lines.append(f'note: config.input_workers={f.input_workers} loader threads per host use '
                 f'at most {f.input_workers} cores: set it to at least '
                 f'{math.ceil(f.cores_needed)}.')
  return lines


def check(config: Any, r: dict[str, Any], names: types.SimpleNamespace
          ) -> dict[str, Any] | None:
  """``planner.report``'s report checked for input: the lines and figures (None where there is
  no TPU slice or no images/s: nothing to feed, or no step time)."""
  if not r.get('libtpu_topology'):
    return None
  if not r.get('images_per_second'):
    return {'lines': ['input feeding: not checked (no step time, so no images/s)']}
  tpu = accelerators.tpu_slice(r['topology'])
  generation = tpu.chip.name
  f = feeding(config, r['images_per_second'], generation, tpu.chips,
              load_rates(names.rates.value), names.per_core.value)
  mixes = bool(config.get('mixup_alpha') or config.get('cutmix_alpha'))
  return {'lines': report_lines(f, config.dataset.pp_train, generation, mixes),
          'pipeline': config.dataset.pp_train, 'hosts': f.hosts,
          'chips_per_host': f.chips_per_host, 'vcpus_per_host': f.vcpus_per_host,
          'images_per_second_per_host': f.per_host, 'images_per_second_per_core': f.per_core,
          'rate_source': f.rate_source, 'host_cores_needed': f.cores_needed,
          'keeps_up': f.keeps_up}
