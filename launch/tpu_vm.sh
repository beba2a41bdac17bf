#!/usr/bin/env bash
# Usage: launch/tpu_vm.sh COMMAND [options] [-- more vit_jax.main flags]
#
# Cloud TPU VMs and pod slices with gcloud: create one, install this checkout on
# every worker, run the same `python -m vit_jax.main` on all of them (each
# worker's process finds the others by itself), follow it, stop it, delete it.
# The workdir must be on Cloud Storage (gs://...): every worker writes its share
# of the checkpoints there, and it outlives the VM.
#
# Commands:
#   up      start or resume: create the TPU and install (if it is missing, or
#           deleting it first if it was preempted), then run. Again after a
#           preemption, it resumes from the last checkpoint in WORKDIR. A TPU that
#           is up keeps its installation: `setup` updates it. With --restarts=N it
#           stays to watch the run (every WATCH_EVERY s): when a worker's run
#           fails (killed, a host that stopped answering) or the TPU is preempted,
#           it stops the rest, brings the slice up again as above and restarts the
#           run from the newest good checkpoint, up to N times, one line each
#           (docs/scale.md)
#   create  create the TPU VM or pod slice (through a queued resource with
#           --queued, waiting until it is ACTIVE)
#   setup   copy this checkout to every worker; make ~/vit_jax_venv there
#   run     start the run on every worker, in the background (a second run is
#           refused while one is going); each worker logs to ~/vit_jax_logs/run.log
#   logs    fetch the last LINES lines of each worker's log into LOGDIR/WORKER.log
#   tail    follow one worker's log (--worker, default 0); Ctrl-C stops following
#   stop    SIGTERM the run on every worker: it saves a checkpoint and exits
#   status  describe the TPU (and its queued resource)
#   delete  delete the TPU VM (and its queued resource)
#
# Options (or the environment variable in capitals):
#   --project=ID              PROJECT           required
#   --zone=ZONE               ZONE              required, e.g. us-central2-b
#   --accelerator-type=TYPE   ACCELERATOR_TYPE  required by create/up: v3-32, v4-64,
#                                               v5litepod-16, v5p-32, v6e-16, ...
#   --workdir=gs://B/DIR      WORKDIR           required by run/up
#   --config=FILE             CONFIG            required by run/up, e.g.
#                                               configs/vit_l16_i21k.py
#   --name=NAME               TPU_NAME          default: vit-jax
#   --capacity=KIND           CAPACITY          on-demand (default), spot or reserved
#   --queued                  QUEUED=1          create through a queued resource
#   --valid-until=DURATION    VALID_UNTIL       queued: give up after, e.g. 6h
#   --version=VERSION         RUNTIME_VERSION   default: by TPU generation
#   --logdir=DIR              LOGDIR            default: ~/vit_jax_logs/NAME
#   --lines=N                 LINES             logs: default 200
#   --worker=I                WORKER            tail: default 0
#   --restarts=N              RESTARTS          up: restarts after a failure; default: 0
#   --watch-every=SECONDS     WATCH_EVERY       up --restarts: default 60
#   -n, --dry-run             print the commands, run nothing
#   -h, --help                this text
#
# Multi-worker ssh needs your key in an agent: ssh-add ~/.ssh/google_compute_engine

set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# shellcheck disable=SC2034  # OPTIONS and SWITCHES are read by parse_args.
declare -A OPTIONS=([--project]=PROJECT [--zone]=ZONE [--accelerator-type]=ACCELERATOR_TYPE
  [--workdir]=WORKDIR [--config]=CONFIG [--name]=TPU_NAME [--capacity]=CAPACITY
  [--valid-until]=VALID_UNTIL [--version]=RUNTIME_VERSION [--logdir]=LOGDIR [--lines]=LINES
  [--worker]=WORKER [--restarts]=RESTARTS
  [--watch-every]=WATCH_EVERY) SWITCHES=([--queued]=QUEUED)
parse_args "$@"
((${#POSITIONAL[@]} == 1)) || die "give one command (up, create, setup, run, logs, tail, stop, status, delete); see --help"
COMMAND=${POSITIONAL[0]}
TPU_NAME=${TPU_NAME:-vit-jax}
CAPACITY=${CAPACITY:-on-demand}
QUEUED=${QUEUED:-0}
LOGDIR=${LOGDIR:-$HOME/vit_jax_logs/$TPU_NAME}
RESTARTS=${RESTARTS:-0}
[[ $RESTARTS =~ ^[0-9]+$ ]] || die "RESTARTS must be a number >= 0, not '$RESTARTS'"
WATCH_EVERY=${WATCH_EVERY:-60}
[[ $WATCH_EVERY =~ ^[1-9][0-9]*$ ]] || die "WATCH_EVERY must be a number of seconds >= 1, not '$WATCH_EVERY'"

# Paths on the workers (relative to the home directory there).
REMOTE_REPO=vit_jax
REMOTE_VENV=vit_jax_venv
REMOTE_LOG=vit_jax_logs/run.log
REMOTE_PID=vit_jax_logs/run.pid
REMOTE_STATUS=vit_jax_logs/run.status  # The run's exit status, once it has ended.

require PROJECT --project ZONE --zone
where=("--project=$PROJECT" "--zone=$ZONE")

# The runtime image for each TPU generation (cloud.google.com/tpu/docs/runtimes).
runtime_version() {
  case $1 in
    v2-* | v3-* | v4-*) echo tpu-ubuntu2204-base ;;
    v5litepod-*) echo v2-alpha-tpuv5-lite ;;
    v5p-*) echo v2-alpha-tpuv5 ;;
    v6e-*) echo v2-alpha-tpuv6e ;;
    *) die "no default runtime image for ACCELERATOR_TYPE=$1: set RUNTIME_VERSION (--version)" ;;
  esac
}

# on_workers WORKERS COMMAND [gcloud flags...]: runs a shell command over ssh.
on_workers() {
  local workers=$1 command=$2
  shift 2
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${where[@]}" "--worker=$workers" \
    "--command=$command" "$@"
}

create() {
  require ACCELERATOR_TYPE --accelerator-type
  [[ $ACCELERATOR_TYPE =~ ^v[0-9][a-z0-9]*-[0-9]+$ ]] ||
    die "ACCELERATOR_TYPE looks wrong: '$ACCELERATOR_TYPE' (e.g. v4-32, v5litepod-16, v6e-8)"
  local version=${RUNTIME_VERSION:-}
  [[ -n $version ]] || version=$(runtime_version "$ACCELERATOR_TYPE")
  local capacity=()
  case $CAPACITY in
    on-demand) ;;
    spot) capacity=(--spot) ;;
    reserved) capacity=(--reserved) ;;
    *) die "CAPACITY must be on-demand, spot or reserved, not '$CAPACITY'" ;;
  esac
  # Orbax and the metric writers reach gs:// with the VM's service account.
  local scopes=--scopes=https://www.googleapis.com/auth/cloud-platform
  if [[ $QUEUED == 1 ]]; then
    local until=()
    [[ -z ${VALID_UNTIL:-} ]] || until=("--valid-until-duration=$VALID_UNTIL")
    run gcloud compute tpus queued-resources create "$TPU_NAME" "${where[@]}" \
      "--node-id=$TPU_NAME" "--accelerator-type=$ACCELERATOR_TYPE" \
      "--runtime-version=$version" "$scopes" ${capacity[@]+"${capacity[@]}"} \
      ${until[@]+"${until[@]}"}
    wait_until_active
  else
    # Returns when the TPU is READY.
    run gcloud compute tpus tpu-vm create "$TPU_NAME" "${where[@]}" \
      "--accelerator-type=$ACCELERATOR_TYPE" "--version=$version" "$scopes" \
      ${capacity[@]+"${capacity[@]}"}
  fi
}

queued_state() {
  run gcloud compute tpus queued-resources describe "$TPU_NAME" "${where[@]}" \
    '--format=value(state.state)'
}

wait_until_active() {
  if [[ $DRY_RUN == 1 ]]; then
    queued_state
    note "(the line above is repeated every 60 s until the state is ACTIVE)"
    return
  fi
  local state
  while :; do
    state=$(queued_state)
    case $state in
      ACTIVE) return ;;
      FAILED | SUSPENDED | SUSPENDING) die "queued resource $TPU_NAME is $state" ;;
    esac
    note "queued resource $TPU_NAME: ${state:-unknown}; waiting"
    sleep 60
  done
}

setup() {
  local tarball=${TMPDIR:-/tmp}/vit_jax-$TPU_NAME.tar.gz
  run tar -C "$REPO_ROOT" --exclude=.git --exclude=.venv --exclude=__pycache__ \
    --exclude='*.egg-info' --exclude=.pytest_cache --exclude=.ruff_cache -czf "$tarball" .
  run gcloud compute tpus tpu-vm scp "$tarball" "$TPU_NAME:vit_jax.tar.gz" "${where[@]}" \
    --worker=all
  on_workers all "set -e; rm -rf ~/$REMOTE_REPO; mkdir -p ~/$REMOTE_REPO; \
tar -xzf ~/vit_jax.tar.gz -C ~/$REMOTE_REPO; \
bash ~/$REMOTE_REPO/launch/install.sh --venv=\$HOME/$REMOTE_VENV --jax-extra=tpu"
}

start() {
  require WORKDIR --workdir CONFIG --config
  [[ $WORKDIR == gs://?* ]] || die "WORKDIR must be on Cloud Storage (gs://BUCKET/DIR), \
not '$WORKDIR': every worker writes there, and it outlives the VM"
  # --distributed: jax.distributed.initialize() finds the slice's workers by itself
  # (also the preemption notice that makes every worker save on SIGTERM).
  local main
  main="\$HOME/$REMOTE_VENV/bin/python $(quote -m vit_jax.main --distributed "--config=$CONFIG" \
    "--workdir=$WORKDIR" ${PASS[@]+"${PASS[@]}"})"
  # From ~/vit_jax, so that relative config paths work; detached from the ssh session.
  on_workers all "if [ ! -x ~/$REMOTE_VENV/bin/python ]; then \
echo \"\$(hostname): vit_jax is not installed here: run $(basename "$0") setup\" >&2; exit 1; fi; \
cd ~/$REMOTE_REPO && mkdir -p ~/vit_jax_logs || exit 1; \
if [ -f ~/$REMOTE_PID ] && kill -0 \$(cat ~/$REMOTE_PID) 2>/dev/null; then \
echo \"\$(hostname): a run is going (pid \$(cat ~/$REMOTE_PID)); stop it first\" >&2; exit 1; fi; \
echo \"=== \$(date -u '+%F %T') \$(hostname)\" >> ~/$REMOTE_LOG; rm -f ~/$REMOTE_PID ~/$REMOTE_STATUS; \
nohup sh -c '\"\$@\" & echo \$! > ~/$REMOTE_PID; wait \$!; echo \$? > ~/$REMOTE_STATUS' sh $main \
>> ~/$REMOTE_LOG 2>&1 < /dev/null & \
while [ ! -s ~/$REMOTE_PID ]; do sleep 0.1; done"
  note "started on every worker; follow with: $(quote "$0" tail "${where[@]}" "--name=$TPU_NAME")"
}

fetch_logs() {
  run mkdir -p "$LOGDIR"
  on_workers all "tail -n ${LINES:-200} ~/$REMOTE_LOG" "--output-directory=$LOGDIR"
  note "one file per worker: $LOGDIR/WORKER.log"
}

# The TPU's state, or NOT_FOUND.
tpu_state() {
  local state
  if [[ $QUEUED == 1 ]]; then
    state=$(queued_state 2>/dev/null) || state=NOT_FOUND
  else
    state=$(run gcloud compute tpus tpu-vm describe "$TPU_NAME" "${where[@]}" \
      '--format=value(state)' 2>/dev/null) || state=NOT_FOUND
  fi
  echo "${state:-NOT_FOUND}"
}

delete() {
  if [[ $QUEUED == 1 ]]; then
    # --force deletes the TPU with its queued resource.
    run gcloud compute tpus queued-resources delete "$TPU_NAME" "${where[@]}" --force --quiet
  else
    run gcloud compute tpus tpu-vm delete "$TPU_NAME" "${where[@]}" --quiet
  fi
}

up() {
  require ACCELERATOR_TYPE --accelerator-type WORKDIR --workdir CONFIG --config
  local state
  if [[ $DRY_RUN == 1 ]]; then
    tpu_state
    note "(dry run: taken as NOT_FOUND; READY/ACTIVE would skip create and setup, PREEMPTED"
    note " or SUSPENDED would delete first)"
    state=NOT_FOUND
  else
    state=$(tpu_state)
    note "TPU $TPU_NAME: $state"
  fi
  case $state in
    READY | ACTIVE) ;;
    ACCEPTED | WAITING_FOR_RESOURCES | PROVISIONING)  # A queued resource, not yet there.
      wait_until_active
      setup
      ;;
    NOT_FOUND)
      create
      setup
      ;;
    PREEMPTED | TERMINATED | SUSPENDED | FAILED)
      delete
      create
      setup
      ;;
    *) die "TPU $TPU_NAME is $state: wait, or delete it" ;;
  esac
  start
}

# The run on every worker, a line each: its exit status once it has ended, 'running', or
# 'gone' (no status: the worker restarted).
run_states() {
  on_workers all "if [ -f ~/$REMOTE_STATUS ]; then cat ~/$REMOTE_STATUS; \
elif [ -f ~/$REMOTE_PID ] && kill -0 \$(cat ~/$REMOTE_PID) 2>/dev/null; then echo running; \
else echo gone; fi"
}

# up, then watches the run every WATCH_EVERY seconds: a worker's failure that a restart can
# mend, or the TPU preempted, stops the run on every worker and brings it up again, up to
# RESTARTS times.
up_and_watch() {
  up
  if [[ $DRY_RUN == 1 ]]; then
    note "(then every $WATCH_EVERY s, the run on every worker until it ends; after a failure, the"
    note " run stopped on every worker and up again, up to $RESTARTS times)"
    run_states
    return
  fi
  local restarts=0 state states failure
  while :; do
    sleep "$WATCH_EVERY"
    failure=
    state=$(tpu_state)
    if [[ $state != READY && $state != ACTIVE ]]; then
      failure="the TPU is $state"
    else
      states=$(run_states 2>/dev/null) || states=gone
      if ! grep -qvx 0 <<<"$states"; then
        note "the run ended on every worker"
        return 0
      fi
      failure=$(grep -vx running <<<"$states" | grep -vx 0 | head -n 1) || continue
      if [[ $failure =~ ^[0-9]+$ ]] && ! restartable "$failure"; then
        note "a worker's run exited with status $failure: not restarted (its log says why)"
        exit "$failure"
      fi
      failure="a worker's run exited with status $(status_words "$failure")"
    fi
    if ((restarts == RESTARTS)); then
      note "$failure; no restart left (--restarts=$RESTARTS)"
      exit 1
    fi
    restarts=$((restarts + 1))
    printf '%s: restart %d of %d: %s; every worker starts again from the newest good checkpoint\n' \
      "$(basename "$0")" "$restarts" "$RESTARTS" "$failure" >&2
    # SIGTERM to the runs still going, SIGKILL to those still there after 60 s.
    [[ $state != READY && $state != ACTIVE ]] || on_workers all "p=\$(cat ~/$REMOTE_PID) || exit 0; \
kill -TERM \$p 2>/dev/null; for i in \$(seq 60); do kill -0 \$p 2>/dev/null || exit 0; sleep 1; done; \
kill -KILL \$p 2>/dev/null; true" || true
    up
  done
}

case $COMMAND in
  up) if ((RESTARTS)); then up_and_watch; else up; fi ;;
  create) create ;;
  setup) setup ;;
  run) start ;;
  logs) fetch_logs ;;
  tail) on_workers "${WORKER:-0}" "tail -n 100 -F ~/$REMOTE_LOG" ;;
  stop)
    on_workers all "if [ -f ~/$REMOTE_PID ] && kill -TERM \$(cat ~/$REMOTE_PID) 2>/dev/null; \
then echo \"\$(hostname): SIGTERM sent\"; else echo \"\$(hostname): no run going\"; fi"
    note "sent SIGTERM; the logs say 'Preempted: saved step N' when the checkpoint is written"
    ;;
  status)
    [[ $QUEUED != 1 ]] || run gcloud compute tpus queued-resources describe "$TPU_NAME" "${where[@]}"
    run gcloud compute tpus tpu-vm describe "$TPU_NAME" "${where[@]}"
    ;;
  delete) delete ;;
  *) die "unknown command '$COMMAND'; see --help" ;;
esac
