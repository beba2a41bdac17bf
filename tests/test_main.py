"""The entry point as users run it: real processes, killed, preempted, and on two hosts."""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import chex
import jax
import numpy as np
import pytest

from vit_jax import main
from vit_jax.base import errors
from vit_jax.config import cli as config_cli
from vit_jax.training import mfu
from vit_jax.training import plan as plan_lib

from runs import (
  QUICKSTART,
  ROOT,
  env,
  local_launch_command,
  main_command,
  read_metrics,
  restore_state,
  tiny_config,
)


def checkpoint_steps(workdir) -> list[int]:
  directory = workdir / 'checkpoints'
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) \
      if directory.exists() else []


def wait_for_checkpoint(process, workdir, step, timeout=300):
  start = time.time()
  while step not in checkpoint_steps(workdir):
    assert process.poll() is None, f'the run ended early (exit {process.returncode})'
    assert time.time() - start < timeout, f'no checkpoint {step} after {timeout}s'
    time.sleep(0.05)


# Runs a command with SIGINT's default action (a terminal's), though this process ignores it
# (pytest-xdist's workers do): exec keeps an ignored signal ignored.
AS_FROM_A_TERMINAL = [sys.executable, '-c', 'import os, signal, sys; signal.signal(signal.SIGINT, '
                      'signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])']


def ctrl_c(command, after, **kwargs):
  """Starts ``command`` as from a terminal (SIGINT handled) and presses Ctrl-C (SIGINT to its
  process group, as a terminal sends it) once a line of its output (stdout and stderr) matches
  ``after``; returns its exit status and its lines from that one on."""
  process = subprocess.Popen([*AS_FROM_A_TERMINAL, *command], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True,
                             **kwargs)
  lines, start = [], None
  for line in process.stdout:
    lines.append(line.rstrip('\n'))
    if start is None and re.search(after, line):
      start = len(lines) - 1
      os.killpg(process.pid, signal.SIGINT)
  process.wait(timeout=900)
  assert start is not None, f'no line matched {after!r}: ' + '\n'.join(lines[-30:])
  return process.returncode, lines[start:]


@pytest.mark.slow
def test_kill_9_sigterm_and_ctrl_c_then_resume_equal_an_uninterrupted_run(tmp_path):
  overrides = {'total_steps': 300, 'checkpoint_every_steps': 50, 'log_every_steps': 10}
  config = tiny_config(**overrides)
  main.train_and_evaluate(config, str(tmp_path / 'reference'))

  workdir = tmp_path / 'interrupted'
  command = main_command(workdir, **overrides)
  # 1. Killed without warning after the step-50 checkpoint.
  run = subprocess.Popen(command, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
  wait_for_checkpoint(run, workdir, 50)
  run.kill()
  run.wait()
  assert max(checkpoint_steps(workdir)) < 300
  # 2. Restarted, then preempted with SIGTERM: it saves where it is and exits cleanly.
  run = subprocess.Popen(command, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
  wait_for_checkpoint(run, workdir, 150)
  run.send_signal(signal.SIGTERM)
  _, stderr = run.communicate(timeout=120)
  assert run.returncode == errors.PREEMPTED_STATUS, stderr[-3000:]  # Not 0: restart it.
  assert 'Preempted: saved step' in stderr
  preempted_at = max(checkpoint_steps(workdir))
  assert 150 <= preempted_at < 300
  assert 'checkpoint_manager.py' not in stderr  # No Orbax INFO lines by default ...
  # 3. Restarted, then Ctrl-C at its first training line: as SIGTERM, in two lines.
  status, lines = ctrl_c(command, r'^step \d+/300 ', cwd=ROOT, env=env())
  interrupted_at = max(checkpoint_steps(workdir))
  assert status == errors.PREEMPTED_STATUS, '\n'.join(lines)
  assert preempted_at < interrupted_at < 300
  assert [line for line in lines[1:] if not re.match(r'step \d+/300 ', line)] == [
      'warning: Ctrl-C: saving a checkpoint at the next step, then exiting (Ctrl-C again stops '
      'at once, saving nothing).',
      f'warning: Preempted: saved step {interrupted_at} in {workdir / "checkpoints"}; run the '
      'same command again to resume.'], '\n'.join(lines)
  # 4. Restarted, then Ctrl-C while it starts: it stops at once, in one line, saving nothing.
  status, lines = ctrl_c(command, r'^Process 0 of 1', cwd=ROOT, env=env())
  assert status == errors.INTERRUPTED_STATUS, '\n'.join(lines)
  assert lines[-1] == (f'warning: Stopped by Ctrl-C: nothing saved past step {interrupted_at}, '
                       'the newest checkpoint; run the same command again to resume from it.')
  assert not [line for line in lines[1:-1] if line.startswith(('warning:', 'error:', 'Trace'))]
  assert max(checkpoint_steps(workdir)) == interrupted_at
  # 5. Restarted again: runs to the end.
  done = subprocess.run(command + ['--verbosity=0'], cwd=ROOT, env=env(), capture_output=True,
                        text=True)
  assert done.returncode == 0, done.stderr[-3000:]
  assert f'Resumed from {workdir / "checkpoints"} at step {interrupted_at}' in done.stderr
  assert 'taking it over' not in done.stderr  # The stopped runs left the lock free.
  assert 'checkpoint_manager.py' in done.stderr  # ... and with --verbosity, they are back.

  chex.assert_trees_all_equal(restore_state(tmp_path / 'reference', config),
                              restore_state(workdir, config))
  reference = {m['step']: m['train/loss'] for m in read_metrics(tmp_path / 'reference')
               if 'train/loss' in m}
  resumed = {m['step']: m['train/loss'] for m in read_metrics(workdir) if 'train/loss' in m}
  logged = [m['step'] for m in read_metrics(workdir) if 'train/loss' in m]
  assert logged == sorted(reference)  # Each step once, though some were logged twice.
  # Each row is the mean loss since the last line: the first line after a restart at a
  # preempted step means fewer steps, unless the preemption fell on a line.
  partial = {s for s in resumed
             if any(stop < s < stop + 10 for stop in (preempted_at, interrupted_at))}
  assert all(reference[s] == loss for s, loss in resumed.items() if s not in partial)


# launch/local.sh's 2 processes x 4 CPU devices, on a (data, fsdp, tensor) = (2, 2, 2) mesh:
# data across the processes, fsdp and tensor in each.
TWO_PROCESSES = {'total_steps': 20, 'eval_every_steps': 10, 'mesh.fsdp': 2, 'mesh.tensor': 2}


@pytest.fixture(scope='module')
def two_processes(tmp_path_factory):
  """The workdir of an uninterrupted launch/local.sh run of TWO_PROCESSES."""
  workdir = tmp_path_factory.mktemp('two_processes')
  launch = subprocess.run(local_launch_command(workdir, **TWO_PROCESSES), cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=1200)
  assert launch.returncode == 0, launch.stderr[-3000:]
  return workdir


@pytest.mark.slow
def test_two_processes_of_four_devices_match_one_of_eight(two_processes, tmp_path):
  """launch/local.sh's 2 processes x 4 CPU devices train as 1 process x 8 devices."""
  config = tiny_config(**TWO_PROCESSES)
  one = main.train_and_evaluate(config, str(tmp_path / 'one'))

  workdir = two_processes
  assert 'Process 1 of 2; 4 local / 8 global devices' in (
      workdir / 'logs' / 'process_1.log').read_text()

  a = [m for m in read_metrics(tmp_path / 'one') if 'train/loss' in m]
  b = [m for m in read_metrics(workdir) if 'train/loss' in m]  # Only process 0 writes.
  assert [m['step'] for m in a] == [m['step'] for m in b]
  np.testing.assert_allclose([m['train/loss'] for m in a], [m['train/loss'] for m in b],
                             rtol=1e-5)
  evals = [m for m in read_metrics(workdir) if 'eval/accuracy' in m]
  assert [m['eval/examples'] for m in evals] == [359, 359]
  assert evals[-1]['eval/accuracy'] == pytest.approx(one['eval/accuracy'], abs=1 / 359)
  # The checkpoint both processes wrote restores on this 8-device process. (The
  # attention key biases have no gradient at all, softmax ignores them, so Adam
  # turns the collectives' rounding noise there into steps of ~lr: hence atol.)
  chex.assert_trees_all_close(jax.device_get(restore_state(tmp_path / 'one', config).params),
                              jax.device_get(restore_state(workdir, config).params),
                              atol=1e-4, rtol=1e-3)


def child_pid(parent: int, argument: str) -> int:
  """The PID of the child of ``parent`` whose command line holds ``argument``."""
  for stat in pathlib.Path('/proc').glob('[0-9]*/stat'):
    try:
      ppid = int(stat.read_text().rsplit(')', 1)[1].split()[1])
      argv = (stat.parent / 'cmdline').read_bytes().split(b'\0')
    except (OSError, ValueError, IndexError):
      continue
    if ppid == parent and argument.encode() in argv:
      return int(stat.parent.name)
  raise AssertionError(f'no child of {parent} runs with {argument}')


@pytest.mark.slow
def test_a_killed_process_is_restarted_and_the_run_ends_as_if_uninterrupted(two_processes,
                                                                             tmp_path):
  """kill -9 of process 1 mid-run: process 0 ends with one line naming it and the step the
  run resumes from, launch/local.sh --restarts=1 starts both again, and the run ends bitwise
  where the uninterrupted one did."""
  workdir = tmp_path / 'killed'
  command = local_launch_command(workdir, **TWO_PROCESSES)
  split = command.index('--')
  command = [*command[:split], '--restarts=1', '--', '--peer_timeout=5', *command[split + 1:]]
  launcher = subprocess.Popen(command, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
  wait_for_checkpoint(launcher, workdir, 10)
  os.kill(child_pid(launcher.pid, '--process_id=1'), signal.SIGKILL)
  _, stderr = launcher.communicate(timeout=900)
  assert launcher.returncode == 0, stderr[-3000:]
  restarts = [line for line in stderr.splitlines() if line.startswith('local.sh: restart')]
  assert restarts == ['local.sh: restart 1 of 1: process 1 exited with status 137 (process 0: '
                      f'{errors.PEER_LOST_STATUS}); every process starts again from the newest '
                      'good checkpoint'], stderr[-3000:]
  log = (workdir / 'logs' / 'process_0.log').read_text()
  lines = [line for line in log.splitlines() if line.startswith('error:')]
  assert len(lines) == 1 and lines[0].startswith('error: process 1 of 2 (host '), log[-3000:]
  assert 'resumes from step 10, its newest checkpoint' in lines[0]
  assert 'Check failure' not in log and 'Traceback' not in log
  assert f'Resumed from {workdir / "checkpoints"} at step 10.' in log

  config = tiny_config(**TWO_PROCESSES)
  chex.assert_trees_all_equal(restore_state(two_processes, config),
                              restore_state(workdir, config))
  # Every row, those logged before the kill and again after it too, as the uninterrupted
  # run's (less the speeds).
  reference = {}
  for m in read_metrics(two_processes):
    reference.setdefault(m['step'], {}).update(m)
  rows = read_metrics(workdir)
  assert {m['step'] for m in rows} == reference.keys()
  for m in rows:
    assert {k: v for k, v in m.items() if 'per_s' not in k and 'mfu' not in k} == {
        k: reference[m['step']][k] for k in m if 'per_s' not in k and 'mfu' not in k}


@pytest.mark.slow
def test_ctrl_c_stops_the_launcher_in_two_lines_and_a_lost_coordinator_is_restarted(
    two_processes, tmp_path):
  """launch/local.sh as from a terminal: at Ctrl-C every process saves the same step, and all
  that is printed after it is the launcher's line and the step saved (before: 46 lines of
  jax's preemption notifier, Orbax's sync point per thread and the launcher's reprint of a
  log). Then, run again with --restarts=1, process 0 (the coordinator) is killed: jax aborts
  the other (status 134) or it crashes (139), one line says so, both start again, and the run
  ends bitwise where the uninterrupted one did."""
  workdir = tmp_path / 'stopped'
  command = local_launch_command(workdir, **TWO_PROCESSES)
  # As a user runs it: jax's C++ warnings on (the line of the SIGTERM its notifier caught).
  as_a_user = {k: v for k, v in env().items() if k != 'TF_CPP_MIN_LOG_LEVEL'}
  status, lines = ctrl_c(command, r'^step 5/20 ', cwd=ROOT, env=as_a_user)
  assert status == errors.PREEMPTED_STATUS, '\n'.join(lines)
  saved = max(checkpoint_steps(workdir))
  assert 5 < saved < 20
  # (The training's own lines, where the stop comes late on a busy machine, are not the stop's.)
  assert [line for line in lines[1:] if not re.match(r'(step \d+/20|eval at step \d+:) ', line)
          ] == [
      'stopping: every process saves a checkpoint, then exits (Ctrl-C again kills them)',
      f'warning: Preempted: saved step {saved} in {workdir / "checkpoints"}; run the same '
      'command again to resume.'], '\n'.join(lines)
  assert 'preemption_notifier.cc' in (workdir / 'logs' / 'process_0.log').read_text()

  split = command.index('--')
  command = [*command[:split], '--restarts=1', '--', '--peer_timeout=5', *command[split + 1:]]
  launcher = subprocess.Popen(command, cwd=ROOT, env=env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
  log = workdir / 'logs' / 'process_0.log'
  start = time.time()
  while f'Resumed from {workdir / "checkpoints"} at step {saved}' not in log.read_text():
    assert launcher.poll() is None and time.time() - start < 300, log.read_text()[-3000:]
    time.sleep(0.05)
  os.kill(child_pid(launcher.pid, '--process_id=0'), signal.SIGKILL)
  _, stderr = launcher.communicate(timeout=900)
  assert launcher.returncode == 0, stderr[-3000:]
  restarts = [line for line in stderr.splitlines() if line.startswith('local.sh: restart')]
  # jaxlib ends the survivor by an abort (134) or, as often here, a crash (139): either named.
  lost = (r"134, jax's abort|139, jax's crash \(a segmentation fault\)")
  assert len(restarts) == 1 and re.fullmatch(
      r'local.sh: restart 1 of 1: process 0 \(the coordinator\) exited with status 137 '
      rf'\(process 1: ({lost}) on losing process 0, the coordinator\); every process starts '
      'again from the newest good checkpoint', restarts[0]), stderr
  config = tiny_config(**TWO_PROCESSES)
  chex.assert_trees_all_equal(restore_state(two_processes, config),
                              restore_state(workdir, config))


ABSL_PREFIX = re.compile(r'^[DIWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [\w.]+:\d+\]')


@pytest.mark.slow
def test_quickstart_command_reaches_95_percent_and_reads_plainly(tmp_path):
  """The README's main job, exactly as documented; what a person reads of it: no absl
  prefixes, no malloc line, the model named by its shape, MFU over the CPU peak kept in
  the cache file (not measured again at the start); every line with its prefix in the
  log file."""
  cache = tmp_path / 'cache'
  kept = cache / 'vit_jax' / 'matmul_peak.json'
  kept.parent.mkdir(parents=True)
  # A peak no measurement gives on this machine: the run must take it from the file.
  key = mfu.peak_key('cpu', 'cpu', 1, 'float32')
  kept.write_text(json.dumps({key: {'flops': 123e9, 'measured': '2026-01-02'}}))
  workdir = tmp_path / 'q'
  done = subprocess.run(
      [sys.executable, '-m', 'vit_jax.main', '--config=configs/quickstart.py',
       f'--workdir={workdir}'], cwd=ROOT, env={**env(devices=1), 'XDG_CACHE_HOME': str(cache)},
      capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-3000:]
  assert 'step 1500/1500' in done.stderr and 'img/s' in done.stderr and 'ETA' in done.stderr
  assert 'MFU' in done.stderr and 'Done: step 1500/1500, 1500 trained in' in done.stderr
  # One screen: a line per 100 steps and per evaluation, a few more at the start and end.
  assert len(done.stderr.splitlines()) <= 40, done.stderr
  final = [m for m in read_metrics(workdir) if 'eval/accuracy' in m][-1]
  assert final['step'] == 1500 and final['eval/examples'] == 359
  assert final['eval/accuracy'] >= 0.95
  assert checkpoint_steps(workdir) == [1000, 1500]
  assert json.loads((workdir / 'config.json').read_text())['model']['name'] == 'ti16'
  assert list(workdir.glob('events.out.tfevents.*'))

  console_lines = done.stderr.splitlines()
  assert not [line for line in console_lines if ABSL_PREFIX.match(line)], done.stderr
  assert 'malloc' not in done.stderr and 'GLIBC_TUNABLES' not in done.stderr
  assert 'ViT (4 layers, width 64, MLP 128, 4 heads, patch 4): ' in done.stderr
  assert (f'over the float32 matmul peak of 1 cpu device, 123 GFLOP/s, measured 2026-01-02 '
          f'(kept in {kept})') in done.stderr
  log = (workdir / 'log.txt').read_text().splitlines()
  assert f'Log with timestamps and third-party lines: {workdir / "log.txt"}' in done.stderr
  # Every console line is in the file, after absl's prefix; the malloc line (one device:
  # no keep_freed) is there only.
  for line in console_lines:
    assert any(ABSL_PREFIX.match(row) and row.endswith('] ' + line) for row in log), line
  assert any(ABSL_PREFIX.match(row) and 'malloc huge_pages (VIT_JAX_MALLOC;' in row
             for row in log)
  assert any('orbax' in row for row in log)  # Third-party INFO lines: in the file only.
  # MFU: the model's FLOPs of a training image at the logged speed over the kept peak.
  flops = 3 * plan_lib.validate(config_cli.load(str(QUICKSTART))).model.forward_flops()
  rows = [m for m in read_metrics(workdir) if 'train/mfu' in m]
  assert rows
  for m in rows:
    assert m['train/mfu'] == pytest.approx(flops * m['train/images_per_s'] / 123e9, rel=1e-6)
  assert json.loads(kept.read_text()) == {key: {'flops': 123e9, 'measured': '2026-01-02'}}


@pytest.mark.slow
@pytest.mark.parametrize('kind', ['npz', 'timm', 'big_vision'])
def test_a_damaged_init_from_is_refused_before_the_workdir_is_written(tmp_path, kind):
  """A garbage .npz, a timm folder whose model.safetensors lost its last byte, or a big_vision
  checkpoint copied but for one array's chunk, as config.init_from: one error line, found by
  the plan's check (the .npz's first bytes, the safetensors' header and size, the chunks each
  .zarray describes) before the lock and the log file, so the new workdir is never created."""
  if kind == 'npz':
    damaged = tmp_path / 'x.npz'
    damaged.write_bytes(np.random.default_rng(0).bytes(300))
    problem = (f'{damaged} is not a .npz checkpoint: it does not begin as a zip archive does (a '
               'damaged or partial download, or another kind of file). Download it again.')
  elif kind == 'big_vision':
    damaged = shutil.copytree(ROOT / 'tests' / 'data' / 'hub' / 'bv_tok', tmp_path / 'bv')
    array = damaged / 'checkpoint.bv-000000003' / 'params~embedding~kernel'
    (array / '0.0.0.0').unlink()
    problem = (f'{array}: its chunk 0.0.0.0 is missing (of 1), which zarr would read as zeros: '
               'a partial copy. Copy the checkpoint again.')
  else:
    damaged = shutil.copytree(ROOT / 'tests' / 'data' / 'hub' / 'timm_augreg', tmp_path / 'timm')
    weights = damaged / 'model.safetensors'
    weights.write_bytes(weights.read_bytes()[:-1])
    problem = (f'{weights} is not a safetensors file: its header does not describe its bytes (a '
               'damaged or partial download, or another kind of file). Download it again.')
  workdir = tmp_path / 'new'
  done = subprocess.run(main_command(workdir, init_from=damaged), cwd=ROOT, env=env(1),
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 2, done.stderr
  assert done.stderr.splitlines() == [f'error: config.init_from: {problem}']
  assert not workdir.exists() or not any(workdir.iterdir())
