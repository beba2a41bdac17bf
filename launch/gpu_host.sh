#!/usr/bin/env bash
# Usage: launch/gpu_host.sh --workdir=DIR --config=FILE [options] [-- more vit_jax.main flags]
#
# One GPU machine, all its GPUs: one `python -m vit_jax.main` process, which
# shards each batch over every visible GPU. JAX_PLATFORMS=cuda makes it fail at
# once if jax has no CUDA support (rather than train on the CPU); --install
# puts jax[cuda12] (or JAX_EXTRA) and this checkout into the current Python.
# For several machines use slurm.sbatch. The output is shown and kept in LOG.
#
#   launch/gpu_host.sh --workdir=/data/runs/b16 --config=configs/vit_b16_i1k.py \
#       -- --config.dataset.data_dir=/data/tensorflow_datasets
#
# Options (or the environment variable in capitals):
#   --workdir=DIR        WORKDIR      required: checkpoints and logs
#   --config=FILE        CONFIG       required, e.g. configs/vit_b16_i1k.py
#   --gpus=LIST          GPUS         e.g. 0,1,2,3 (CUDA_VISIBLE_DEVICES); default: all
#   --install            INSTALL=1    pip install -e . "jax[JAX_EXTRA]" first
#   --jax-extra=EXTRA    JAX_EXTRA    cuda12 (default) or cuda13
#   --log=FILE           LOG          default: ~/vit_jax_logs/gpu_host-DATE-TIME.log
#   --python=PYTHON      PYTHON       default: python3
#   -n, --dry-run        print the commands, run nothing
#   -h, --help           this text

set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# shellcheck disable=SC2034  # OPTIONS and SWITCHES are read by parse_args.
declare -A OPTIONS=([--workdir]=WORKDIR [--config]=CONFIG [--gpus]=GPUS [--jax-extra]=JAX_EXTRA
  [--log]=LOG [--python]=PYTHON) SWITCHES=([--install]=INSTALL)
parse_args "$@"
((${#POSITIONAL[@]} == 0)) || die "unexpected argument '${POSITIONAL[0]}' (vit_jax.main flags go after --)"
require WORKDIR --workdir CONFIG --config
PYTHON=${PYTHON:-python3}
JAX_EXTRA=${JAX_EXTRA:-cuda12}
LOG=${LOG:-$HOME/vit_jax_logs/gpu_host-$(date +%Y%m%d-%H%M%S).log}
[[ $JAX_EXTRA == cuda12 || $JAX_EXTRA == cuda13 ]] ||
  die "JAX_EXTRA must be cuda12 or cuda13, not '$JAX_EXTRA'"
[[ -z ${GPUS:-} || $GPUS =~ ^[0-9]+(,[0-9]+)*$ ]] ||
  die "GPUS must be a comma-separated list of GPU indices, not '$GPUS'"

if [[ ${INSTALL:-0} == 1 ]]; then
  run "$PYTHON" -m pip install -e "$REPO_ROOT" "jax[$JAX_EXTRA]"
fi
run nvidia-smi -L || die "no NVIDIA GPU here: nvidia-smi -L failed"

environment=(JAX_PLATFORMS=cuda)
[[ -z ${GPUS:-} ]] || environment+=("CUDA_VISIBLE_DEVICES=$GPUS")
command=(env "${environment[@]}" "$PYTHON" -m vit_jax.main "--config=$CONFIG"
  "--workdir=$WORKDIR" ${PASS[@]+"${PASS[@]}"})
if [[ $DRY_RUN == 1 ]]; then
  printf 'mkdir -p %s\n' "$(quote "$(dirname "$LOG")")"
  printf '%s 2>&1 | tee -a %s\n' "$(quote "${command[@]}")" "$(quote "$LOG")"
  exit 0
fi
mkdir -p "$(dirname "$LOG")"
note "log: $LOG"
printf '+ %s\n' "$(quote "${command[@]}")" >&2
# The run replaces this shell, so that signals (SIGTERM, Ctrl-C: save and exit) reach it. The
# tee ignores Ctrl-C: the run must be able to write while it saves (and say which step).
exec > >(
  trap '' INT
  exec tee -a "$LOG"
) 2>&1
exec "${command[@]}"
