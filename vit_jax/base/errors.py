"""User errors: problems the user can fix, reported in one line instead of a traceback.

A bad config, a missing or damaged file, a checkpoint that does not fit the model: the message
names the problem and the fix, and the entry points (``run``) print it as ``error: ...`` and exit
with status 2 (``EXIT_STATUS``); any other exception is a bug and keeps its traceback (status 1).
A job wrapper can also act on 65 (``DIVERGED_STATUS``: the training went non-finite; nothing
non-finite was saved, and the same command would diverge again), 74 (``SAVE_FAILED_STATUS``: a
checkpoint, the metrics or an export could not be written; the earlier checkpoints are
intact), 75 (``PREEMPTED_STATUS``: stopped by SIGTERM or Ctrl-C after saving; run the same
command again to resume), 130 (``INTERRUPTED_STATUS``: stopped at once by a second Ctrl-C,
or by one before training started, saving nothing) and 69 (``PEER_LOST_STATUS``: another
process of a multi-process run stopped answering; run the same command again to resume, as
the launch scripts' ``--restarts=N`` do);
docs/reliability.md. Each class is also the built-in exception callers expect (``ConfigError``
is a ``ValueError``, ``MissingFileError`` a ``FileNotFoundError``).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

EXIT_STATUS = 2
DIVERGED_STATUS = 65  # sysexits' EX_DATAERR: rerunning the same command fails the same way.
SAVE_FAILED_STATUS = 74
PREEMPTED_STATUS = 75
PEER_LOST_STATUS = 69  # sysexits' EX_UNAVAILABLE: a peer is gone; restart the run.
INTERRUPTED_STATUS = 130  # A shell's 128 + SIGINT: stopped at once by Ctrl-C.


class UserError(Exception):
  """A problem with what the user gave (config, files, checkpoints), not with the code."""


class ConfigError(UserError, ValueError):
  """A config field that cannot work; the message names the field and the fix."""


class MissingFileError(UserError, FileNotFoundError):
  """A file or directory the user named is not there."""


class PathError(UserError, OSError):
  """A path the user named that cannot be used as asked: a workdir that cannot be written,
  a file where a folder is needed."""


class DataError(UserError, ValueError):
  """Input data that cannot be used as it is (a class folder that is a loop, a damaged shard)."""


class CheckpointError(UserError, ValueError):
  """A checkpoint that cannot be restored: damaged, or holding another model's state."""


class CheckpointMismatchError(CheckpointError):
  """A checkpoint that holds another model's parameters or state than the one it is loaded
  into (a release file or a run's Orbax state): nothing is damaged, so nothing falls back."""


class NonFiniteCheckpointError(CheckpointError):
  """A checkpoint whose state holds NaN or infinity (its run diverged): refused by the tools
  that read it, unless they are asked to allow it."""


class WorkdirInUseError(UserError):
  """Another run holds the workdir's lock: one run per workdir."""


class Diverged(UserError, FloatingPointError):
  """The training went non-finite (loss, gradients or state): exit status 65. Nothing
  non-finite was saved; the message names the step and the last good checkpoint."""

  exit_status = DIVERGED_STATUS


class CheckpointSaveError(UserError, OSError):
  """A checkpoint that could not be written (disk full, permission): exit status 74."""

  exit_status = SAVE_FAILED_STATUS


class WriteError(UserError, OSError):
  """A file a command writes (an export) that could not be written (disk full, permission):
  exit status 74, as a failed save; nothing was left behind (``paths.atomic_files``)."""

  exit_status = SAVE_FAILED_STATUS


class MetricsWriteError(UserError, OSError):
  """The run's metrics (metrics.jsonl, TensorBoard's events) could not be written: exit status
  74, as a checkpoint's; the checkpoints written before are intact."""

  exit_status = SAVE_FAILED_STATUS


class Preempted(Exception):  # noqa: N818 (not an error: the run saved and stopped as asked)
  """The run stopped on SIGTERM after saving a checkpoint: exit status 75, no ``error:`` line
  (the log says which step was saved)."""

  exit_status = PREEMPTED_STATUS


class Interrupted(Exception):  # noqa: N818 (not an error: the user stopped the run)
  """Stopped at once by Ctrl-C (a second one while the run saves, or one before it trains):
  exit status 130 after one ``warning:`` line saying what was saved; no traceback."""

  exit_status = INTERRUPTED_STATUS


class PeerLost(Exception):  # noqa: N818 (not the user's: a restart is the remedy)
  """Another process of a multi-process run stopped answering (``vit_jax.base.peers``): exit
  status 69 after one ``error:`` line naming it and the step the run resumes from."""

  exit_status = PEER_LOST_STATUS


class UsageError(UserError):
  """A command line that does not parse: a missing or unknown flag, a value of the wrong type."""


def one_line(main: Callable[[list[str]], Any]) -> Callable[[list[str]], Any]:
  """``main`` with a ``UserError`` (or absl's ``app.UsageError``) printed as one line on
  stderr (exit status 2, or the error's own ``exit_status``), ``Preempted`` as exit status 75
  and Ctrl-C (``Interrupted``, ``KeyboardInterrupt``) as one line and exit status 130."""
  from absl import app

  def wrapped(argv: list[str]) -> Any:
    try:
      return main(argv)
    except Preempted:
      sys.exit(PREEMPTED_STATUS)
    except (Interrupted, KeyboardInterrupt) as e:
      print(f'warning: {e or "Stopped by Ctrl-C."}', file=sys.stderr, flush=True)
      sys.exit(INTERRUPTED_STATUS)
    except UserError as e:
      sys.exit(report(e))
    except app.UsageError as e:
      sys.exit(report(UsageError(f'{e} (--helpshort lists the flags).')))
  return wrapped


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing (``app.run``'s ``flags_parser``) with its errors (a required flag
  left out, an unknown flag, a bad value) as one ``error:`` line and exit status 2, instead
  of absl's two lines and exit status 1."""
  from absl import flags

  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    message = str(e)
    if match := re.fullmatch(r'flag --(\w+)=None: Flag --\w+ must have a value other than None\.',
                             message):
      message = f'--{match.group(1)} is required'
    sys.exit(report(UsageError(f'{message} (--helpshort lists the flags).')))


class ArgumentParser(argparse.ArgumentParser):
  """``argparse.ArgumentParser`` whose errors are one ``error:`` line (exit status 2), as
  the absl entry points', instead of argparse's usage block and ``PROG: error:`` line; a
  flag's prefix is not taken for the flag (as absl does not)."""

  def __init__(self, *args: Any, **kwargs: Any) -> None:
    kwargs.setdefault('allow_abbrev', False)
    super().__init__(*args, **kwargs)

  def error(self, message: str) -> NoReturn:
    sys.exit(report(UsageError(f'{message} ({self.prog} --help lists the arguments).')))


def report(e: BaseException) -> int:
  """Prints ``e`` as one line, ``error: ...``, on stderr; returns its exit status (2, or
  the error's own ``exit_status``)."""
  message = ' '.join(str(e).split())  # One line, whatever the message held.
  print(f'error: {message}', file=sys.stderr, flush=True)
  return getattr(e, 'exit_status', EXIT_STATUS)


def run(main: Callable[[list[str]], Any], arguments: bool = True, **kwargs: Any) -> None:
  """``absl.app.run(main)`` with user errors and flag errors as one line (``one_line``,
  ``parse_flags``); ``arguments=False``: a command that takes none, whose stray arguments
  are a usage error ("Unexpected arguments: [...]") before ``main`` runs; kwargs go to app.run."""
  from absl import app

  def checked(argv: list[str]) -> Any:
    if len(argv) > 1 and not arguments:
      raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
    return main(argv)
  kwargs.setdefault('flags_parser', parse_flags)
  app.run(one_line(checked), **kwargs)


# (signs in the error's text, the cause in words, what to do, what a run can also do): the
# common causes of a failed save; anything else is named by its own message.
SAVE_CAUSES = (
    (('No space left on device', "os_error_code='28'"), 'the disk is full',
     'free space there', ' (or lower config.keep_checkpoints)'),
    (('Disk quota exceeded', "os_error_code='122'"), 'the disk quota is exceeded',
     'free space there or raise the quota', ''),
    (('Permission denied', "os_error_code='13'"), 'permission denied',
     'make the {place} writable by this user', ''),
    (('Read-only file system', "os_error_code='30'"), 'the file system is read-only',
     'use a writable {place}', ''),
)


def write_failure(e: BaseException, run: bool = True) -> tuple[str, str]:
  """(the cause in words, what to do) of a failed write: one of ``SAVE_CAUSES`` with the OS's
  words and the file, not TensorStore's or TensorFlow's long preamble; else its own message.
  ``run``: the write of a training run (its workdir, its checkpoints), else of a command's
  output (an export)."""
  text = str(e)
  for signs, what, how, run_how in SAVE_CAUSES:
    if any(sign in text for sign in signs):
      written = re.findall(r'(?:Failed writing|Error writing local file):? "([^"]+)"', text)
      how = how.format(place='workdir' if run else 'destination') + (run_how if run else '')
      return f'{what} ({signs[0]}{f", writing {written[-1]}" if written else ""})', how
  return short(e), 'fix the cause'


def short(e: BaseException) -> str:
  """An Orbax / TensorStore error in a line: without the spec it dumps, at most 300 chars."""
  text = ' '.join(str(e).split('[tensorstore_spec')[0].split())
  return f'{type(e).__name__}: {text[:300]}'
