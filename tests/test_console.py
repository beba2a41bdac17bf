"""Tests of vit_jax.console: progress lines with an ETA, and the third-party INFO filter."""

import logging

import orbax.checkpoint
from absl import logging as absl_logging

from vit_jax import console, train


def test_progress_lines_rate_and_eta(monkeypatch):
  now = [0.]
  monkeypatch.setattr(console.time, 'perf_counter', lambda: now[0])
  lines = []
  progress = console.Progress('convert', 1000, every=10., write=lines.append)
  for t, done in ((5., 100), (30., 250), (35., 300), (60., 500)):
    now[0] = t
    progress.update(done)
  # Not before 10 s, then at most one line every 10 s; the ETA from the rate so far.
  assert lines == ['convert: 250/1,000 images (25%), 8/s, ETA 0h01m30s',
                   'convert: 500/1,000 images (50%), 8/s, ETA 0h01m00s']
  now[0] = 3725.
  progress.finish(1000)
  assert lines[-1] == 'convert: 1,000/1,000 images, 0/s, in 1h02m05s'
  # Without a total, the share done comes from elsewhere (the converter's tars).
  unknown = console.Progress('convert', None, every=0., write=lines.append)
  now[0] += 20.
  unknown.update(40, fraction=0.25)
  assert lines[-1] == 'convert: 40 images (25%), 2/s, ETA 0h01m00s'


def test_third_party_info_is_dropped_ours_and_warnings_kept():
  handler = absl_logging.get_absl_handler()
  before = list(handler.filters)
  try:
    console.quiet_third_party()
    console.quiet_third_party()  # Once is enough: the filter is not added twice.
    assert len(handler.filters) == len(before) + 1

    def passes(level, path):
      return bool(handler.filter(logging.LogRecord('absl', level, path, 1, 'm', (), None)))
    assert not passes(logging.INFO, orbax.checkpoint.__file__)
    assert passes(logging.WARNING, orbax.checkpoint.__file__)
    assert passes(logging.INFO, train.__file__)
  finally:
    handler.filters[:] = before
