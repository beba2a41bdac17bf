"""Every entry point: a user's mistake is one ``error:`` line and exit status 2, found before
the heavy start-up (no jax import where the entry point's module does not import it)."""

import contextlib
import os
import pathlib
import subprocess
import sys

import pytest

from vit_jax.base import cpu

ROOT = pathlib.Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / 'configs' / 'quickstart.py')
FINETUNE = str(ROOT / 'configs' / 'vit_b16_finetune.py')
UNDER_FILE = 'cannot be created: {file} is a file'  # A path under a file.

# Runs a module as `python -m` does and says on stdout, at exit, whether jax was imported.
_RUN = ('import atexit, runpy, sys\n'
        'atexit.register(lambda: print("jax imported:", "jax" in sys.modules, flush=True))\n'
        'sys.argv = sys.argv[1:]\n'
        'runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)\n')

# (module, arguments ({file}, {dir}, {run}: see `places`), a piece of the message, whether the
# check comes before any jax import). {file} is a file, so {file}/sub cannot be created.
CASES = [
    ('vit_jax.main', [f'--config={QUICKSTART}'], '--workdir is required', True),
    ('vit_jax.main', ['--workdir={dir}/w'], '--config is required', True),
    ('vit_jax.main', [f'--config={QUICKSTART}', '--workdir={dir}/w', '--bogus=1'],
     "Unknown command line flag 'bogus'", True),
    ('vit_jax.main', [f'--config={QUICKSTART}', '--workdir={dir}/w', '--cpu_devices=two'],
     '--cpu_devices=two', True),
    ('vit_jax.main', [f'--config={QUICKSTART}', '--workdir={dir}/w', 'extra'],
     "Unexpected arguments: ['extra']", True),
    ('vit_jax.main', [f'--config={FINETUNE}:cifar11', '--workdir={dir}/w'],
     "'cifar11' is not a choice: pick one of imagenet2012, cifar10, cifar100", True),
    ('vit_jax.main', [f'--config={QUICKSTART}:b16', '--workdir={dir}/w'],
     'takes no argument', True),
    ('vit_jax.main', ['--config={dir}/nope.py', '--workdir={dir}/w'], 'does not exist', True),
    ('vit_jax.main', [f'--config={QUICKSTART}', '--workdir={dir}/w', '--config.nope=1'],
     'config.nope is not a config field', True),
    ('vit_jax.main', [f'--config={QUICKSTART}', '--workdir={dir}/w', '--config.batch_size=None'],
     'config.batch_size=None cannot be None', True),
    ('vit_jax.main', [f'--config={QUICKSTART}', '--workdir={file}'], 'is a file, not a folder',
     True),
    ('vit_jax.main', [f'--config={QUICKSTART}', '--workdir={file}/sub'], UNDER_FILE,
     True),
    ('vit_jax.main', [f'--config={QUICKSTART}', '--workdir={dir}/w',
                      '--config.init_from={dir}/nope.npz'],
     '--config.init_from={dir}/nope.npz does not exist', True),
    ('vit_jax.sweep', [f'--config={QUICKSTART}', '--workdir={file}/sub'], UNDER_FILE,
     True),
    ('vit_jax.vtab', ['--init_from={dir}/nope.npz', '--workdir={dir}/v'],
     '--init_from={dir}/nope.npz does not exist', True),
    ('vit_jax.vtab', ['--init_from={file}', '--workdir={file}/sub'], UNDER_FILE, True),
    ('vit_jax.tools.export', ['--workdir={run}'], '--out is required', True),
    ('vit_jax.tools.export', ['--workdir={dir}/nope', '--out={dir}/o.npz'], 'does not exist',
     True),
    ('vit_jax.tools.export', ['--workdir={dir}', '--out={dir}/o.npz'],
     'is not the workdir of a vit_jax.main run', True),
    ('vit_jax.tools.export', ['--workdir={run}', '--out={file}/o.npz'], UNDER_FILE,
     True),
    ('vit_jax.tools.export', ['--source={dir}/nope', '--out={dir}/o', '--format=timm'],
     '--source={dir}/nope does not exist', True),
    ('vit_jax.data.convert', ['--out={dir}/c'], '--source is required', True),
    ('vit_jax.data.convert', ['--source={dir}/nope', '--out={dir}/c'], 'does not exist', True),
    ('vit_jax.data.convert', ['--source={dir}', '--out={file}/c'], UNDER_FILE, True),
    ('vit_jax.tools.aot', [f'--config={QUICKSTART}'], '--topology is required', True),
    *[(f'benchmarks.{name}', ['--bogus'], "Unknown command line flag 'bogus'", True)
      for name in ('train', 'input', 'integrity', 'tpu_step', 'faults')],
    *[(f'benchmarks.{name}', ['--big_vision={dir}'], 'not a big_vision checkout', True)
      for name in ('train', 'tpu_step')],
    ('vit_jax.evaluate', [], '--workdir is required', True),
    ('vit_jax.evaluate', ['--workdir={dir}/nope'], 'does not exist', True),
    ('vit_jax.evaluate', ['--workdir={run}', '--patch_sizes=16,0'],
     '--patch_sizes=16,0: give positive integers', True),
    ('vit_jax.evaluate', ['--source={dir}/nope', f'--config={QUICKSTART}'], 'does not exist',
     True),
    # Which kind of checkpoint a --source folder is, is read by a module that imports jax.
    ('vit_jax.tools.predict', ['--source={dir}', '{file}'], 'is not a checkpoint vit_jax reads',
     False),
    ('vit_jax.tools.predict', ['{file}'], 'one of the arguments --workdir --npz', True),
    ('vit_jax.tools.predict', ['--npz={dir}/nope.npz', '{file}'], 'does not exist', True),
    ('vit_jax.tools.predict', ['--workdir={run}', '{dir}/nope.png'],
     '{dir}/nope.png does not exist', True),
    ('vit_jax.tools.inspect', ['--workdir={run}', '--out={file}/i'], UNDER_FILE, True),
    ('vit_jax.fewshot', ['--workdir={run}'], '--dataset is required', True),
    ('vit_jax.fewshot', ['--workdir={dir}/nope', '--dataset=digits'], 'does not exist', True),
    # A stray argument to a command that takes none (errors.run's arguments=False).
    *[(module, [*args, 'extra'], "Unexpected arguments: ['extra']", True) for module, args in [
        ('vit_jax.tools.export', ['--workdir={run}', '--out={dir}/o.npz']),
        ('vit_jax.data.convert', ['--source={dir}', '--out={dir}/c']),
        ('vit_jax.tools.aot', [f'--config={QUICKSTART}', '--topology=cpu']),
        ('vit_jax.evaluate', ['--workdir={run}']),
        ('vit_jax.fewshot', ['--workdir={run}', '--dataset=digits'])]],
]


# The checks added with the commands' early answers: slow (each starts a process).
CASES += [pytest.param(*case, marks=pytest.mark.slow) for case in [
    # A schedule in epochs of a dataset whose size aot does not know: asked for, before jax.
    ('vit_jax.tools.aot', [f'--config={ROOT}/configs/vit_b16_i1k.py', '--topology=cpu',
                           '--config.dataset.name=jft_like'],
     "dataset 'jft_like' is not known here: pass --num_train_examples", True),
    # A prefix of --workdir is not taken for it.
    ('vit_jax.tools.predict', ['--work={run}', '{file}'], 'one of the arguments --workdir',
     True),
    ('vit_jax.fewshot', ['--workdir={run}', '--datset=digits'],
     "Unknown command line flag 'datset'. Did you mean: dataset ?", True),
    ('vit_jax.fewshot', ['--workdir={run}', '--dataset=digits', '--shot=5'],
     "Unknown command line flag 'shot'", True),
    # A missing local data folder: refused before jax starts.
    ('vit_jax.main', [f'--config={QUICKSTART}', '--workdir={dir}/w',
                      '--config.dataset.data_dir={dir}/nope'],
     '--config.dataset.data_dir={dir}/nope does not exist', True),
    # ~ and $VAR in a path flag's value are expanded (a shell leaves them after --FLAG=).
    ('vit_jax.vtab', ['--init_from=~/vit_jax_no_such.npz', '--workdir={dir}/v'],
     '--init_from={home}/vit_jax_no_such.npz does not exist', True),
    ('vit_jax.main', ['--config=$VIT_JAX_TEST_DIR/nope.py', '--workdir={dir}/w'],
     '--config={dir}/nope.py does not exist', True),
    ('vit_jax.tools.export', ['--workdir=~/vit_jax_no_such_run', '--out={dir}/o.npz'],
     '--workdir={home}/vit_jax_no_such_run does not exist', True),
    # Every VTAB task's data, checked before the first fine-tune, in one line.
    ('vit_jax.vtab', ['--init_from={file}', '--workdir={dir}/v', '--data_dir=~/vit_jax_none',
                      '--tasks=natural'],
     '7 of the 7 tasks have no prepared TFDS dataset in {home}/vit_jax_none (the folder does '
     'not exist): caltech101, cifar100, dtd, oxford_flowers102, oxford_iiit_pet, sun397, '
     'svhn. Prepare them with: python -m vit_jax.vtab prepare --data_dir={home}/vit_jax_none '
     '--tasks=natural; oxford_iiit_pet needs a manual download first', True),
]]


# Mistakes that were answered only once jax had started (31-122 s on a busy 2-core machine),
# now before it (under a second): those that need no data, and a checkpoint's header.
_QUICK = [f'--config={QUICKSTART}', '--workdir={dir}/w']
_ON_CPU = cpu.runs_on_cpu()  # The device count is known before jax on the CPU only.
CASES += [pytest.param(*case, marks=pytest.mark.slow) for case in [
    ('vit_jax.main', [*_QUICK, '--config.schedule.base_lr=-0.003'],
     'config.schedule.base_lr=-0.003 must be positive (e.g. 1e-3)', True),
    ('vit_jax.main', [*_QUICK, '--config.model.name=xyz'],
     "config.model.name: Unknown model 'xyz'", True),
    ('vit_jax.main', [*_QUICK, '--config.model.name=b17'],
     "config.model.name='b17' names ViT-B_17 (hidden_size=768", True),
    ('vit_jax.main', [*_QUICK, '--cpu_devices=2', '--config.mesh.fsdp=16'],
     'config.mesh: data=0 x fsdp=16 x tensor=1 does not cover the 2 devices', _ON_CPU),
    ('vit_jax.main', [*_QUICK, '--cpu_devices=3'],
     'config.batch_size=128 is not divisible by the 3 devices', _ON_CPU),
    ('vit_jax.main', [*_QUICK, "--config.evals.fewshot.datasets=('nosuch_dataset',)"],
     "config.evals.fewshot: few-shot dataset 'nosuch_dataset': no dataset of that name is "
     'prepared', True),
    ('vit_jax.main', [*_QUICK, '--config.init_from={npz}'],
     'config.init_from: {npz} is not a .npz checkpoint numpy can read', True),
    ('vit_jax.main', [*_QUICK, '--config.init_from={partial}'],
     'config.init_from: {partial}/model.safetensors is not a safetensors file', True),
]]


@pytest.fixture(scope='module')
def places(tmp_path_factory) -> dict[str, str]:
  """{dir}: an empty folder; {file}: a file; {run}: a folder laid out as a run's workdir;
  {npz}: a .npz file cut short; {partial}: a timm folder whose model.safetensors is."""
  root = tmp_path_factory.mktemp('mistakes')
  (root / 'file').write_text('')
  (root / 'run' / 'checkpoints').mkdir(parents=True)
  (root / 'cut.npz').write_bytes(b'PK\x03\x04' + bytes(60))
  timm = ROOT / 'tests' / 'data' / 'hub' / 'timm_augreg'
  (root / 'partial').mkdir()
  (root / 'partial' / 'config.json').write_bytes((timm / 'config.json').read_bytes())
  weights = (timm / 'model.safetensors').read_bytes()
  (root / 'partial' / 'model.safetensors').write_bytes(weights[:len(weights) // 2])
  return {'dir': str(root / 'empty'), 'file': str(root / 'file'), 'run': str(root / 'run'),
          'home': os.path.expanduser('~'), 'npz': str(root / 'cut.npz'),
          'partial': str(root / 'partial')}


@pytest.mark.slow
@pytest.mark.parametrize('module, args, message, before_jax', CASES,
                         ids=[f'{getattr(c, "values", c)[0].split(".")[-1]}-{i}'
                              for i, c in enumerate(CASES)])
def test_a_mistake_is_one_error_line_and_exit_2(places, module, args, message, before_jax):
  os.makedirs(places['dir'], exist_ok=True)
  args = [a.format(**places) for a in args]
  env = {k: v for k, v in os.environ.items() if k != 'JAX_PLATFORMS'}
  p = subprocess.run([sys.executable, '-c', _RUN, module, *args], capture_output=True,
                     text=True, cwd=ROOT, timeout=120,
                     env={**env, 'PYTHONPATH': str(ROOT), 'VIT_JAX_TEST_DIR': places['dir']})
  lines = p.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: '), p.stderr
  assert message.format(**places) in lines[0]
  assert p.returncode == 2
  if before_jax:
    assert 'jax imported: False' in p.stdout
  assert not os.path.exists(os.path.join(places['dir'], 'w'))  # Nothing created.


@pytest.mark.slow
def test_a_refused_run_answers_before_jax_and_leaves_nothing_behind(tmp_path):
  """Mistakes whose answer needs no data, answered by vit_jax.main before jax starts (they
  came after it, 8-9 s in, leaving log.txt and run.lock): an unknown dataset, a warm-up as
  long as the run, a workdir another run holds (its lock held here, for real), a resume with
  another batch size (a run's config.json and checkpoint), an uncached hf-hub: id offline, a
  missing teacher. Nothing is created or written."""
  from vit_jax.checkpoints.run import lock, workdir
  from vit_jax.config import cli

  run = tmp_path / 'run'
  (run / workdir.CHECKPOINTS / '10').mkdir(parents=True)
  workdir.write_run_info(run, cli.load(QUICKSTART), 10, ())
  cases = [
      (['--config.dataset.name=imagenet9'], "config.dataset.name='imagenet9': no dataset of "
       'that name is prepared in '),
      (['--config.total_steps=10', '--config.schedule.warmup_steps=10'],
       'config.schedule: the warm-up (10 steps) is not shorter than the run (10 steps).'),
      ([], f'{run} is in use by another run (PID {os.getpid()} on '),
      (['--config.batch_size=32'], 'A resume is the same run, but config.batch_size=32 (128)'),
      (['--config.init_from=hf-hub:test-org/absent'], 'hf-hub:test-org/absent is not in the '
       'Hugging Face cache'),
      ([f'--config.distill.teacher={tmp_path / "absent"}'],
       f'--config.distill.teacher={tmp_path / "absent"} does not exist: name an existing '
       'checkpoint'),
  ]
  with lock.hold(run):  # A run that ended: its lock emptied, left.
    pass
  before = sorted(p.name for p in run.iterdir())
  for i, (args, message) in enumerate(cases):
    held = lock.hold(run) if 'in use' in message else contextlib.nullcontext()
    with held:
      p = subprocess.run([sys.executable, '-c', _RUN, 'vit_jax.main', f'--config={QUICKSTART}',
                          f'--workdir={run if i > 1 else tmp_path / "new"}', *args],
                         capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, 'PYTHONPATH': str(ROOT), 'HF_HUB_OFFLINE': '1',
                              'HF_HOME': str(tmp_path / 'hf_home')})
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f'error: {message}'), p.stderr
    assert p.returncode == 2 and 'jax imported: False' in p.stdout
    assert sorted(p.name for p in run.iterdir()) == before and not (tmp_path / 'new').exists()
    assert (run / lock.LOCK_FILE).read_text() == ''


# A misspelled flag on every command (absl's suggestion, or argparse's refusal).
TYPOS = [
    ('vit_jax.main', [f'--config={QUICKSTART}', '--wrokdir={dir}/w'], 'Did you mean: workdir'),
    ('vit_jax.evaluate', ['--wrokdir={run}'], 'Did you mean: workdir'),
    ('vit_jax.fewshot', ['--workdir={run}', '--datset=digits'], 'Did you mean: dataset'),
    ('vit_jax.sweep', [f'--config={QUICKSTART}', '--workdir={dir}/s', '--seed=3'],
     'Did you mean: seeds'),
    ('vit_jax.vtab', ['--init_from={file}', '--workdir={dir}/v', '--task=dmlab'],
     'Did you mean: tasks'),
    ('vit_jax.tools.aot', [f'--config={QUICKSTART}', '--topolgy=v3-8'], "flag 'topolgy'"),
    ('vit_jax.tools.export', ['--workdir={run}', '--ot={dir}/o.npz'], "flag 'ot'"),
    ('vit_jax.tools.predict', ['--workdir={run}', '--tpo=3', '{file}'],
     'unrecognized arguments: --tpo=3'),
    ('vit_jax.tools.inspect', ['--workdir={run}', '--out={dir}/i', '--shwo=3'],
     'unrecognized arguments: --shwo=3'),
    ('vit_jax.data.convert', ['--source={dir}', '--out={dir}/c', '--shard=4'],
     'Did you mean: shards'),
]


@pytest.mark.slow
@pytest.mark.parametrize('module, args, message', TYPOS, ids=[t[0] for t in TYPOS])
def test_a_typo_is_answered_before_the_heavy_imports(places, module, args, message):
  """The whole command, as a user starts it (python -m), answers a misspelled flag before
  jax, flax or TensorFlow load. Its time is printed (``-n 0 -s``), not asserted: the figures are in
  results/RESULTS.md."""
  import time

  os.makedirs(places['dir'], exist_ok=True)
  args = [a.format(**places) for a in args]
  start = time.perf_counter()
  p = subprocess.run([sys.executable, '-c', _RUN, module, *args], capture_output=True,
                     text=True, cwd=ROOT, env={**os.environ, 'PYTHONPATH': str(ROOT)},
                     timeout=60)
  print(f'{module}: {time.perf_counter() - start:.2f} s')
  assert p.returncode == 2 and message in p.stderr, p.stderr
  assert 'jax imported: False' in p.stdout
