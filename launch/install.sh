#!/usr/bin/env bash
# Usage: launch/install.sh [--venv=DIR] [--jax-extra=EXTRA] [--dry-run]
#
# Installs this checkout (editable) with jax[EXTRA] into a new virtual
# environment, on a machine that may have no Python new enough: tpu_vm.sh runs
# it on every TPU worker (Ubuntu 22.04 images ship Python 3.10, jax needs 3.11+).
# It uses the first python3.13 / python3.12 / python3.11 / python3 on PATH that
# is at least 3.11 and can create a venv; failing that, uv (installed with pip
# --user if missing) creates the venv with a Python it downloads.
#
# Options (or the environment variable in capitals):
#   --venv=DIR          VENV        default: ~/vit_jax_venv (replaced if present)
#   --jax-extra=EXTRA   JAX_EXTRA   tpu, cuda12, cuda13 or cpu; default: tpu
#   -n, --dry-run       print the commands, run nothing
#   -h, --help          this text

set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# shellcheck disable=SC2034  # OPTIONS and SWITCHES are read by parse_args.
declare -A OPTIONS=([--venv]=VENV [--jax-extra]=JAX_EXTRA) SWITCHES=()
parse_args "$@"
((${#POSITIONAL[@]} == 0)) || die "unexpected argument '${POSITIONAL[0]}'"
VENV=${VENV:-$HOME/vit_jax_venv}
JAX_EXTRA=${JAX_EXTRA:-tpu}
case $JAX_EXTRA in
  tpu | cuda12 | cuda13) jax="jax[$JAX_EXTRA]" ;;
  cpu) jax=jax ;;
  *) die "JAX_EXTRA must be tpu, cuda12, cuda13 or cpu, not '$JAX_EXTRA'" ;;
esac

[[ ! -e $VENV || -f $VENV/pyvenv.cfg ]] ||
  die "VENV=$VENV exists and is not a virtual environment: not replacing it"

python=
for candidate in python3.13 python3.12 python3.11 python3; do
  if command -v "$candidate" >/dev/null &&
    "$candidate" -c 'import ensurepip, sys, venv; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    python=$candidate
    break
  fi
done

run rm -rf "$VENV"
if [[ -n $python ]]; then
  run "$python" -m venv "$VENV"
else
  note "no Python >= 3.11 with venv on PATH: uv makes the environment"
  uv=uv
  if ! command -v uv >/dev/null; then
    run python3 -m pip install --user --quiet uv
    uv=$HOME/.local/bin/uv
  fi
  run "$uv" venv --seed --python=3.12 "$VENV"
fi
run "$VENV/bin/python" -m pip install --quiet --upgrade pip
run "$VENV/bin/python" -m pip install --quiet -e "$REPO_ROOT" "$jax"
run "$VENV/bin/python" -c 'import jax, vit_jax; print("vit_jax installed with jax", jax.__version__)'
