#!/usr/bin/env bash
# Usage: launch/local.sh --workdir=DIR [options] [-- more vit_jax.main flags]
#
# Runs N processes of `python -m vit_jax.main` on this machine, joined by
# jax.distributed through 127.0.0.1: the multi-host code path (a coordinator,
# per-process input shares, collective checkpoints) on one machine, on CPU.
# Each process simulates K CPU devices, so the run sees N x K devices.
#
#   launch/local.sh --workdir=/tmp/local2 -- --config.total_steps=200
#
# Process 0's output is shown here and, like every process's, added to
# LOGDIR/process_I.log. When one process fails the others are stopped, and the
# launcher exits with the failed process's status; with --restarts=N it starts
# every process again instead (they resume from the newest good checkpoint), up
# to N times, one line each, unless the failure would come again (a user error,
# a divergence, a failed save: docs/scale.md); when process 0 (the coordinator)
# dies, jax aborts the others (status 134): one line says so, and restarts them
# as any other failure. Ctrl-C (or SIGTERM) is passed on as SIGTERM: the run
# saves a checkpoint and exits (status 75), saying which step it saved; run the
# same command again to resume. A second Ctrl-C kills the processes.
#
# Options (or the environment variable in capitals):
#   --workdir=DIR          WORKDIR        required: checkpoints and logs
#   --config=FILE          CONFIG         default: configs/quickstart.py
#   --num-processes=N      NUM_PROCESSES  default: 2
#   --cpu-devices=K        CPU_DEVICES    CPU devices per process; default: 4
#   --port=PORT            COORDINATOR_PORT  default: a free port
#   --logdir=DIR           LOGDIR         default: WORKDIR/logs
#   --restarts=N           RESTARTS       restarts after a failure; default: 0
#   --python=PYTHON        PYTHON         default: python3
#   -n, --dry-run          print the commands, run nothing
#   -h, --help             this text

set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# shellcheck disable=SC2034  # OPTIONS and SWITCHES are read by parse_args.
declare -A OPTIONS=([--workdir]=WORKDIR [--config]=CONFIG [--num-processes]=NUM_PROCESSES
  [--cpu-devices]=CPU_DEVICES [--port]=COORDINATOR_PORT [--logdir]=LOGDIR [--python]=PYTHON
  [--restarts]=RESTARTS) SWITCHES=()
parse_args "$@"
((${#POSITIONAL[@]} == 0)) || die "unexpected argument '${POSITIONAL[0]}' (vit_jax.main flags go after --)"

require WORKDIR --workdir
CONFIG=${CONFIG:-configs/quickstart.py}
NUM_PROCESSES=${NUM_PROCESSES:-2}
CPU_DEVICES=${CPU_DEVICES:-4}
LOGDIR=${LOGDIR:-$WORKDIR/logs}
PYTHON=${PYTHON:-python3}
RESTARTS=${RESTARTS:-0}
[[ $RESTARTS =~ ^[0-9]+$ ]] || die "RESTARTS must be a number >= 0, not '$RESTARTS'"
[[ $NUM_PROCESSES =~ ^[1-9][0-9]*$ ]] || die "NUM_PROCESSES must be a positive integer, not '$NUM_PROCESSES'"
[[ $CPU_DEVICES =~ ^[1-9][0-9]*$ ]] || die "CPU_DEVICES must be a positive integer, not '$CPU_DEVICES'"
PORT=${COORDINATOR_PORT:-}
# A free port for each start (a restart's coordinator needs one too), unless one was given.
free_port() {
  [[ -z ${COORDINATOR_PORT:-} ]] || return 0
  PORT=$("$PYTHON" -c 'import socket
with socket.socket() as s:
  s.bind(("127.0.0.1", 0))
  print(s.getsockname()[1])') || die "could not find a free port with PYTHON=$PYTHON"
}

# XLA_FLAGS as given, without any device count of its own, plus ours.
xla_flags=()
read -r -a words <<<"${XLA_FLAGS:-}"
for word in "${words[@]}"; do
  [[ $word == --xla_force_host_platform_device_count=* ]] || xla_flags+=("$word")
done
xla_flags+=("--xla_force_host_platform_device_count=$CPU_DEVICES")

run mkdir -p "$LOGDIR"
if [[ $DRY_RUN != 1 ]]; then
  # Process 0: shown here and kept in its log. The tee ignores Ctrl-C, which is for the
  # launcher to pass on: process 0 must be able to write while it saves. jax's C++ line for
  # the SIGTERM it was sent ('preemption_notifier.cc ... SIGTERM caught') is for the log only.
  exec {tee_fd}> >(
    trap '' INT
    tee -a "$LOGDIR/process_0.log" | { grep --line-buffered -v 'preemption_notifier\.cc' || true; }
  )
  tee_pid=$!
fi
pids=()
logs=()
# Passes SIGTERM on to every process that is still running.
terminate() {
  local pid
  for pid in ${pids[@]+"${pids[@]}"}; do
    kill -TERM "$pid" 2>/dev/null || true
  done
}
# The first Ctrl-C (or SIGTERM) asks every process to save and stop; a second one kills them.
# shellcheck disable=SC2329  # Called by the trap below.
stop() {
  if ((stopping)); then
    note "killing every process"
    for pid in ${pids[@]+"${pids[@]}"}; do
      kill -KILL "$pid" 2>/dev/null || true
    done
  else
    stopping=1
    note "stopping: every process saves a checkpoint, then exits (Ctrl-C again kills them)"
    terminate
  fi
}
stopping=0
trap stop INT TERM

# Starts every process; returns when all have exited: STATUS is the first failure's
# (0 if none), FAILED its process, OTHERS the other processes' statuses ('process 0: 69').
start_all() {
  free_port
  pids=()
  for ((i = 0; i < NUM_PROCESSES && !stopping; i++)); do
    command=(env JAX_PLATFORMS=cpu "XLA_FLAGS=${xla_flags[*]}" JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo
      "$PYTHON" -m vit_jax.main "--config=$CONFIG" "--workdir=$WORKDIR"
      "--coordinator_address=127.0.0.1:$PORT" "--num_processes=$NUM_PROCESSES"
      "--process_id=$i" ${PASS[@]+"${PASS[@]}"})
    logs[i]=$LOGDIR/process_$i.log
    if [[ $DRY_RUN == 1 ]]; then
      if ((i == 0)); then
        printf '%s 2>&1 | tee -a %s &\n' "$(quote "${command[@]}")" "$(quote "${logs[i]}")"
      else
        printf '%s >> %s 2>&1 &\n' "$(quote "${command[@]}")" "$(quote "${logs[i]}")"
      fi
      continue
    fi
    printf '+ %s\n' "$(quote "${command[@]}")" >&2
    if ((i == 0)); then
      "${command[@]}" >&"$tee_fd" 2>&1 {tee_fd}>&- &
    else
      "${command[@]}" >>"${logs[i]}" 2>&1 {tee_fd}>&- &
    fi
    pids[i]=$!
  done
  [[ $DRY_RUN == 1 ]] && return

  # Waits for all processes; after the first failure, stops the rest (SIGKILL after 60 s).
  STATUS=0
  local kill_at='' rc
  declare -A finished=()
  while ((${#finished[@]} < ${#pids[@]})); do
    for i in "${!pids[@]}"; do
      [[ -z ${finished[$i]:-} ]] || continue
      kill -0 "${pids[i]}" 2>/dev/null && continue
      rc=0
      wait "${pids[i]}" || rc=$?
      finished[$i]=$rc
      if ((rc != 0 && STATUS == 0)); then
        STATUS=$rc FAILED=$i
        if ((stopping && rc == 75)); then
          :  # Stopped as asked, and saved: process 0's line says which step.
        elif restarting; then
          :  # One line, below.
        elif ((rc == 134)); then  # jax's abort, not this process's fault: its dumps stay in its log.
          printf '%s: process %d exited with status %s; its log: %s\n' \
            "$(basename "$0")" "$i" "$(status_words "$rc")" "${logs[i]}" >&2
        else
          printf '%s: %s exited with status %d; the end of %s:\n' \
            "$(basename "$0")" "$(process_name "$i")" "$rc" "${logs[i]}" >&2
          tail -n 30 "${logs[i]}" >&2
        fi
        terminate
        kill_at=$((SECONDS + 60))
      fi
    done
    if [[ -n $kill_at ]] && ((SECONDS > kill_at)); then
      for i in "${!pids[@]}"; do
        [[ -n ${finished[$i]:-} ]] || kill -KILL "${pids[i]}" 2>/dev/null || true
      done
    fi
    # (A Ctrl-C also ends the sleep; the trap has passed it on.)
    ((${#finished[@]} < ${#pids[@]})) && { sleep 0.5 || true; }
  done
  OTHERS=()
  for i in "${!pids[@]}"; do
    [[ $i == "${FAILED:-}" ]] || OTHERS+=("process $i: $(status_words "${finished[$i]}" \
      "$([[ ${FAILED:-} == 0 ]] && echo lost)")")
  done
  return 0
}

# process_name I: 'process I', and for process 0 of several, what it is to the others.
process_name() {
  if (($1 == 0 && NUM_PROCESSES > 1)); then
    printf 'process 0 (the coordinator)'
  else
    printf 'process %d' "$1"
  fi
}

# Whether the failure in STATUS is restarted: restarts left, not stopped by the user, and
# not a failure that the same command meets again.
restarting() {
  ((restarts < RESTARTS && !stopping)) && restartable "$STATUS"
}

restarts=0
start_all
if [[ $DRY_RUN == 1 ]]; then
  ((RESTARTS == 0)) || note "after a failure, the commands above run again, up to $RESTARTS times"
  exit 0
fi
while ((STATUS != 0)) && restarting; do
  restarts=$((restarts + 1))
  others=$(IFS=';'; echo "${OTHERS[*]}")
  printf '%s: restart %d of %d: %s exited with status %s (%s); every process starts again from the newest good checkpoint\n' \
    "$(basename "$0")" "$restarts" "$RESTARTS" "$(process_name "$FAILED")" "$(status_words "$STATUS")" "${others//;/; }" >&2
  start_all
done
status=$STATUS
exec {tee_fd}>&-
wait "$tee_pid" || true
# A stop asked for and done (every process saved): process 0's line said it all.
((stopping && status == 75)) || note "logs: $LOGDIR/process_{0..$((NUM_PROCESSES - 1))}.log"
exit "$status"
