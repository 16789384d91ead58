"""The one exception type the trainer raises for bad input.

`task.py` turns a `UserError` into a single log line and a non-zero exit; anything else is a bug and keeps
its traceback.
"""

import re


class UserError(Exception):
  """Bad input from the user: a flag, an environment variable, a file or a record.

  The message is one line that names what was wrong, the bad value and what would be accepted.
  """


class DataError(UserError):
  """A bad record met while the input pipeline ran (after pre-flight): the runner keeps the checkpoints a run
  wrote before it, since a rerun on fixed data resumes from them."""


# Prefix of the messages of the data checks run in the graph (tf.debugging.Assert); `data_errors` reads the detail
# after it. Here, the leaf module, so the feature kinds and the encoder can both raise such checks.
DATA_CHECK_PREFIX = "trainer-data-check:"


def first_line(error: BaseException, *, limit: int = 300) -> str:
  """The first line of an exception's message (TensorFlow's `OpError.message` included), for a one-line error."""
  text = str(getattr(error, "message", None) or error).strip()
  if not text:
    return type(error).__name__
  lines = [line for line in text.splitlines() if line.strip()]
  first = lines[0]
  if first.startswith("Exception encountered when calling") and len(lines) > 1:
    # Keras 3 says where first and what after it (in bold): "... when calling Dense.call(): <what went wrong>".
    first = f"{first.rstrip('.')}: {_ANSI.sub('', lines[1]).strip()}"
  return first.split(" [[")[0][:limit]


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class ExternalFailure(Exception):
  """Something outside this process failed, not the input: a peer replica, or Cloud Storage.

  `task.py` turns it into one `error:` line and EXIT_EXTERNAL_FAILURE (not the bad-input code 2): a non-zero exit
  makes Vertex restart the replica or the job, which resumes from the last checkpoint.
  """


# The trainer's exit codes, here and nowhere else (docs/reliability.md#exit-codes). Vertex restarts a replica
# or a job on any non-zero exit; the codes tell a person (and scripts.local_vertex) why.
EXIT_OK = 0
EXIT_EXTERNAL_FAILURE = 1  # a peer or Cloud Storage failed: a restart resumes from the last checkpoint
EXIT_USER_ERROR = 2  # bad input, one `error:` line: a restart would fail the same way
EXIT_PREEMPTED = 143  # 128 + SIGTERM, what a scheduler expects from a process ended by SIGTERM (a Spot preemption)
