"""The one exception type the trainer raises for bad input.

`task.py` turns a `UserError` into a single log line and a non-zero exit; anything else is a bug and keeps
its traceback.
"""


class UserError(Exception):
  """Bad input from the user: a flag, an environment variable, a file or a record.

  The message is one line that names what was wrong, the bad value and what would be accepted.
  """
