# shellcheck shell=bash
# Helpers shared by the launch scripts; sourced by them, not run.
#
# Every script takes its settings as --flag=VALUE (or --flag VALUE) or as the
# environment variable the flag names, and --dry-run prints each command instead
# of running it, one per line, quoted so that it can be pasted into a shell.
# Lines starting with '#' in that output are explanations, not commands.

if ((BASH_VERSINFO[0] < 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] < 4))); then
  echo "$0: needs bash >= 4.4, this is $BASH_VERSION (on macOS: brew install bash)" >&2
  exit 2
fi

LAUNCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck disable=SC2034  # Used by the scripts that source this file.
REPO_ROOT=$(dirname "$LAUNCH_DIR")
DRY_RUN=${DRY_RUN:-0}
PASS=()        # arguments after '--', passed on to vit_jax.main
POSITIONAL=()  # arguments that are not options (e.g. tpu_vm.sh's command)

die() {
  printf '%s: error: %s\n' "$(basename "$0")" "$*" >&2
  exit 2
}

# Prints the script's header: the comment block from line 2 to the first blank line.
usage() {
  sed -n '2,/^$/{/^$/q;s/^# \{0,1\}//;p;}' "$0"
}

# require VAR FLAG [VAR FLAG ...]: stops at once, naming the first setting that is empty.
require() {
  while (($#)); do
    [[ -n ${!1:-} ]] || die "$1 is not set: pass $2=... or export $1=..."
    shift 2
  done
}

# quote ARG...: the command as one line a shell reads back into the same words.
quote() {
  local words=() arg
  for arg; do
    if [[ $arg =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
      words+=("$arg")
    else
      words+=("'${arg//\'/\'\\\'\'}'")
    fi
  done
  printf '%s\n' "${words[*]}"
}

# run CMD ARG...: prints the command (to stdout under --dry-run, else to stderr with
# a '+ ' in front) and runs it unless this is a dry run.
run() {
  if [[ $DRY_RUN == 1 ]]; then
    quote "$@"
  else
    printf '+ %s\n' "$(quote "$@")" >&2
    "$@"
  fi
}

# note TEXT: an explanation; under --dry-run it is printed as a '#' line.
note() {
  if [[ $DRY_RUN == 1 ]]; then
    printf '# %s\n' "$*"
  else
    printf '%s\n' "$*" >&2
  fi
}

# status_words STATUS [lost]: the exit status, with what it means where a launcher knows it: 134
# is jaxlib's abort of the other processes when process 0, the coordinator (it holds jax's
# coordination service), is gone: about 200 lines of thread dumps in their logs, no fault of
# theirs. With 'lost' (process 0 is known to be gone), 139 is the same loss met as a crash
# (seen as often as the abort on 2 CPU processes: jaxlib's end is not deterministic).
status_words() {
  if (($1 == 134)); then
    printf "%s, jax's abort on losing process 0, the coordinator" "$1"
  elif (($1 == 139)) && [[ ${2:-} == lost ]]; then
    printf "%s, jax's crash (a segmentation fault) on losing process 0, the coordinator" "$1"
  else
    printf '%s' "$1"
  fi
}

# restartable STATUS: whether a run that exited with STATUS is started again by --restarts:
# not after 0, nor after what the same command meets again (vit_jax/base/errors.py: 1 a bug,
# 2 a user error, 65 a divergence, 74 a failed save); after 69 (a process stopped answering),
# 75 (preempted), 134 (jaxlib's abort when process 0 is gone), a signal's 128+N (killed), yes.
NOT_RESTARTED=(0 1 2 65 74)
restartable() {
  local status
  for status in "${NOT_RESTARTED[@]}"; do
    (($1 != status)) || return 1
  done
}

# parse_args "$@" with two associative arrays declared by the caller:
#   OPTIONS  (--flag -> VARIABLE) for options that take a value,
#   SWITCHES (--flag -> VARIABLE) for options that set VARIABLE=1.
# -h/--help prints the usage, -n/--dry-run sets DRY_RUN=1. Words after '--' go to PASS,
# other words that are not options to POSITIONAL; an unknown option is an error.
parse_args() {
  local flag
  while (($#)); do
    case $1 in
      -h | --help)
        usage
        exit 0
        ;;
      -n | --dry-run) DRY_RUN=1 ;;
      --)
        shift
        PASS+=("$@")
        return
        ;;
      --*=*)
        flag=${1%%=*}
        [[ -n ${OPTIONS[$flag]:-} ]] || die "unknown option $flag (see --help)"
        printf -v "${OPTIONS[$flag]}" '%s' "${1#*=}"
        ;;
      --*)
        if [[ -n ${SWITCHES[$1]:-} ]]; then
          printf -v "${SWITCHES[$1]}" '%s' 1
        elif [[ -n ${OPTIONS[$1]:-} ]]; then
          (($# >= 2)) || die "$1 needs a value"
          printf -v "${OPTIONS[$1]}" '%s' "$2"
          shift
        else
          die "unknown option $1 (see --help)"
        fi
        ;;
      *) POSITIONAL+=("$1") ;;
    esac
    shift
  done
}
