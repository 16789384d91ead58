"""Errors met where the training or evaluation data is read, told apart from every other error and named.

Only the places that pull batches translate (`reading(job)` around the training source, `fit` and the evaluation
pass): an error is the data's when TensorFlow says it came out of the input pipeline (a tf.data iterator tags it
with its `IteratorGetNext` node; a corrupt or truncated file raises `DataLossError`). Only then are the files read
again in plain Python, within a time budget, to name the file, the record and the column. The `UserError` keeps
TensorFlow's error as its `__cause__`, and TensorFlow's own words are logged. Anything else (a bug in a model, a
lost peer) passes through unchanged, at once, with its traceback.
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterator

from absl import logging

from trainer.core.errors import DataError
from trainer.core.errors import first_line
from trainer.data import feature_kinds
from trainer.data import features as features_lib
from trainer.planning import preflight

# TensorFlow names the node an error passed through; a tf.data iterator's are IteratorGetNext,
# IteratorGetNextSync, MultiDeviceIteratorGetNextFromShard (eager: "[Op:IteratorGetNext]"). A `for` over a dataset
# inside a tf.function (the evaluation pass) is a dataset reduce, whose errors name no such node but the
# transformation's iterator ("... transformation with iterator: ReduceIterator::Root::...").
_FROM_INPUT_PIPELINE = re.compile(r"IteratorGetNext|transformation with iterator: \w*Iterator::Root")
_QUOTED_LINE_BREAK = "Quoted field has to end with quote followed by delim or end"  # tf.io.decode_csv's words
# The line of TensorFlow's message that says what was wrong with the record.
_DETAIL = re.compile(r"(Feature: .*|Field \d+ .*|Expect(?:ed)? \d+ fields.*|Could not parse .*|Unable to parse .*|"
                     r"Key: .*|StringToNumberOp could not .*|Unknown image file format.*|Input to reshape .*|"
                     + re.escape(features_lib.CHECK_PREFIX) + r".*)$")
BUDGET_SECS = 120.0


def from_input_pipeline(error: BaseException) -> bool:
  """Whether TensorFlow reports `error` as raised by reading or parsing the data."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  if isinstance(error, tf.errors.DataLossError):
    return True
  return (isinstance(error, (tf.errors.InvalidArgumentError, tf.errors.NotFoundError, tf.errors.PermissionDeniedError))
          and bool(_FROM_INPUT_PIPELINE.search(str(error))))


def explain(error: BaseException, inputs: preflight.Inputs, *, splits: tuple[str, ...] = ("train", "eval", "test"),
            budget_secs: float = BUDGET_SECS) -> DataError:
  """One line for a data error met reading `splits`: the bad record by flag, file, record and column when a read in
  Python finds it within `budget_secs`, else what TensorFlow said was wrong, under the flags of those splits."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  flags = "/".join(dict.fromkeys(inputs.flag(split) for split in splits))
  message = getattr(error, "message", None) or str(error)
  found = preflight.find_bad_record(inputs, splits=splits, budget_secs=budget_secs)
  if found is not None:
    return DataError(found)
  if isinstance(error, (tf.errors.NotFoundError, tf.errors.PermissionDeniedError)):
    # Only a file a record names (an image or text by URI) is opened while the pipeline runs.
    return DataError(f"{flags}: a file the data names by URI cannot be read: {_file_problem(message)}")
  detail = _detail(error, message)
  if detail.startswith(feature_kinds.URI_PROBLEM):
    # tf.debugging.Assert prints its message and data as "[text] [data]", quotes escaped.
    text = detail[len(feature_kinds.URI_PROBLEM):].replace("\\'", "'").replace(":] [", ": ").strip(" []")
    return DataError(f"{flags}: {text}")
  if _QUOTED_LINE_BREAK in message or features_lib.CSV_LONG_ROW in message:
    # The line reader split a record that Python's csv reads whole (a split line's fields are miscounted).
    return DataError(f"{flags}: a quoted CSV field holds a line break beyond the first 64 KiB of the first file, "
                     "where pre-flight looks for one, so the files were read line by line: pass --csv_multiline to "
                     "read them with CsvDataset, which follows quotes across lines")
  return DataError(f"{flags}: a record does not fit the schema {inputs.schema_origin} or a file is corrupted "
                   f"({_detail(error, message)}); reading the files again in Python did not find which within "
                   f"{budget_secs:.0f} s")


def _file_problem(message: str) -> str:
  """What TensorFlow said about the file it could not open: the last line of its message that names a path
  ("Error in user-defined function ... Iterator::Root::ParallelMapV2: /data/x.png; No such file or directory")."""
  for line in reversed(message.splitlines()):
    line = line.split(" [[")[0].strip()
    if "gs://" in line or re.search(r"(^|\s)/\S", line):
      if "Iterator::Root::" in line:
        line = line.rsplit("Iterator::Root::", 1)[-1].split(": ", 1)[-1]
      return line
  return message.splitlines()[0] if message else "unknown"


# What a tf.data function said, after the iterator's name ("... transformation with iterator: Iterator::Root::...:
# channels must be 0 or 3 for GIF, got 1"): the cause when no pattern above knows it.
_FUNCTION_SAID = re.compile(r"transformation with iterator: [\w:]+: (.+)$")


def _detail(error: BaseException, message: str) -> str:
  for line in message.splitlines():
    match = _DETAIL.search(line)
    if match:
      return match.group(1).split(" [[")[0].replace(features_lib.CHECK_PREFIX, "").strip(" ]")
  for line in message.splitlines():
    match = _FUNCTION_SAID.search(line)
    if match:
      return match.group(1).split(" [[")[0].strip()
  return first_line(error)


@contextlib.contextmanager
def translated(inputs: preflight.Inputs, *, splits: tuple[str, ...] = ("train", "eval", "test"),
               budget_secs: float = BUDGET_SECS) -> Iterator[None]:
  """Inside, where `splits` are read: an error out of the input pipeline becomes one `DataError` line (caused by
  the original) naming the split's flag and file."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  try:
    yield
  except (tf.errors.DataLossError, tf.errors.InvalidArgumentError, tf.errors.NotFoundError,
          tf.errors.PermissionDeniedError) as error:
    if not from_input_pipeline(error):
      raise
    logging.warning("The input pipeline failed; TensorFlow said: %s",
                    " | ".join(line.strip() for line in str(error).splitlines() if line.strip())[:2000])
    raise explain(error, inputs, splits=splits, budget_secs=budget_secs) from error
