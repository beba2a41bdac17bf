"""Tests of vit_jax.base.console: progress lines with an ETA, and the third-party INFO filter."""

import logging
import re

import orbax.checkpoint
import pytest
from absl import logging as absl_logging

from vit_jax.base import console
from vit_jax.training import loop


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


def test_working_says_what_runs_while_one_long_call_holds_the_thread():
  """A call that blocks (aot's compile; here a sleep) still gets its lines, from a thread:
  what, how long so far, done in; a failure ends the lines without a 'done'."""
  import time

  lines = []
  with console.working('aot: compiling the train step', every=0.05, write=lines.append):
    time.sleep(0.3)
  assert lines[0] == 'aot: compiling the train step ...'
  assert 3 <= lines.count('aot: compiling the train step: 0h00m00s so far') <= 6, lines
  assert lines[-1] == 'aot: compiling the train step: done in 0h00m00s'
  lines.clear()
  with pytest.raises(ValueError), console.working('x', every=10, write=lines.append):
    raise ValueError('out of memory')
  assert lines == ['x ...']


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
    assert passes(logging.INFO, loop.__file__)
  finally:
    handler.filters[:] = before


def _record(level: int, message: str, *args, **extra) -> logging.LogRecord:
  record = logging.LogRecord('absl', level, loop.__file__, 1, message, args, None)
  record.__dict__.update(extra)
  return record


def test_plain_console_lines_and_file_only_lines():
  handler = absl_logging.get_absl_handler()
  filters, formatter = list(handler.filters), handler.formatter
  try:
    console.plain_console()
    console.plain_console()  # Once is enough.
    assert len(handler.filters) == len(filters) + 1
    # The message alone: no date, time, thread or file:line before it.
    assert handler.format(_record(logging.INFO, 'step %d/%d', 5, 10)) == 'step 5/10'
    assert handler.format(_record(logging.WARNING, 'slow')) == 'warning: slow'
    assert handler.format(_record(logging.ERROR, 'lost')) == 'error: lost'
    assert handler.filter(_record(logging.INFO, 'shown'))
    assert not handler.filter(_record(logging.INFO, 'malloc', **console.FILE_ONLY))
  finally:
    handler.filters[:] = filters
    handler.setFormatter(formatter)


def test_log_file_keeps_absl_prefixes_and_file_only_lines(tmp_path, caplog):
  root = logging.getLogger()
  handlers, level = list(root.handlers), root.level
  root.setLevel(logging.INFO)  # As absl sets it in a program (pytest leaves WARNING).
  try:
    path = console.log_file(str(tmp_path / 'run'), 0)
    assert path == str(tmp_path / 'run' / 'log.txt')
    assert console.log_file(str(tmp_path / 'run'), 3).endswith('log.process3.txt')
    absl_logging.info('for the file %d', 7, extra=console.FILE_ONLY)
    # Held until the run creates its workdir (after its config checks): nothing before.
    assert not (tmp_path / 'run').exists()
    (tmp_path / 'run').mkdir()
    absl_logging.warning('and a warning')
    lines = (tmp_path / 'run' / 'log.txt').read_text().splitlines()
    assert len(lines) == 2
    assert re.fullmatch(r'I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ test_console\.py:\d+\] for the file 7',
                        lines[0]), lines
    assert re.fullmatch(r'W\d{4} .* test_console\.py:\d+\] and a warning', lines[1]), lines
    assert (tmp_path / 'run' / 'log.process3.txt').read_text() == '\n'.join(lines) + '\n'
    # A log file that cannot be written: one warning, and the run goes on without it.
    (tmp_path / 'odd' / 'log.txt').mkdir(parents=True)
    console.log_file(str(tmp_path / 'odd'), 0)
    absl_logging.info('one')
    absl_logging.info('two')
    assert [r.getMessage() for r in caplog.records if 'Cannot write' in r.getMessage()] == [
        f'Cannot write the log file {tmp_path / "odd" / "log.txt"} (Is a directory): no more '
        'lines go there.']
  finally:
    for handler in root.handlers[len(handlers):]:
      handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)


def test_logging_to_one_run_of_several(tmp_path):
  root = logging.getLogger()
  handlers, level = list(root.handlers), root.level
  root.setLevel(logging.INFO)
  try:
    for run in ('a', 'b'):
      (tmp_path / run).mkdir()
      with console.logging_to(str(tmp_path / run)) as path:
        absl_logging.info('in %s', run)
      assert path == str(tmp_path / run / 'log.txt')
    absl_logging.info('after both')
    assert root.handlers == handlers  # Each run's file closed at its end.
    for run in ('a', 'b'):
      lines = (tmp_path / run / 'log.txt').read_text().splitlines()
      assert len(lines) == 1 and lines[0].endswith(f'] in {run}'), lines
  finally:
    root.handlers[:] = handlers
    root.setLevel(level)
