"""Log lines Vertex reads right: one JSON object per line on Vertex, absl's text lines elsewhere.

Cloud Logging takes whatever a custom job writes to stderr as severity ERROR, unless the line is a JSON object
with a `severity` field (its structured-logging agent then files it at that severity, the `message` as the text).
absl writes every record to stderr, so without this an INFO progress line shows as an error. On Vertex
(`CLOUD_ML_JOB_ID` set, stderr not a terminal) each record becomes one JSON line with the replica it came from
(`task_type`, `task_index` from TF_CONFIG / CLUSTER_SPEC), so the replicas of one job can be told apart in one
log view; a traceback stays inside its record's message. Lines TensorFlow's C++ runtime writes itself are not
Python records and pass as they are.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Mapping, TextIO

FORMATS = ("auto", "json", "text")
# Python levels -> Cloud Logging's LogSeverity names.
_SEVERITY = {logging.DEBUG: "DEBUG", logging.INFO: "INFO", logging.WARNING: "WARNING", logging.ERROR: "ERROR",
             logging.CRITICAL: "CRITICAL"}


def resolve(log_format: str, environ: Mapping[str, str], stream: TextIO) -> str:
  """`json` or `text`: auto is json on Vertex (CLOUD_ML_JOB_ID set) when the stream is not a terminal."""
  if log_format != "auto":
    return log_format
  return "json" if environ.get("CLOUD_ML_JOB_ID") and not _isatty(stream) else "text"


def _isatty(stream: TextIO) -> bool:
  try:
    return stream.isatty()
  except (AttributeError, ValueError):
    return False


def severity(levelno: int) -> str:
  for level in sorted(_SEVERITY, reverse=True):
    if levelno >= level:
      return _SEVERITY[level]
  return "DEFAULT"


class JsonFormatter(logging.Formatter):
  """One JSON object per record: severity, message (with any traceback), the replica, time and source."""

  def __init__(self, replica: Mapping[str, object]):
    super().__init__()
    self._replica = dict(replica)

  def format(self, record: logging.LogRecord) -> str:
    message = record.getMessage()
    if record.exc_info:
      message += "\n" + self.formatException(record.exc_info)
    return json_line(severity(record.levelno), message, self._replica, record=record)


def json_line(level: str, message: str, replica: Mapping[str, object], *,
              record: logging.LogRecord | None = None) -> str:
  entry: dict[str, object] = {"severity": level, "message": message, **replica}
  if record is not None:
    entry["time"] = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat()
    entry["logging.googleapis.com/sourceLocation"] = {"file": record.pathname, "line": str(record.lineno),
                                                      "function": record.funcName}
  return json.dumps(entry, ensure_ascii=False)


def replica_fields(environ: Mapping[str, str]) -> dict[str, object]:
  """task_type and task_index of this replica, from TF_CONFIG (or Vertex's CLUSTER_SPEC); none when absent."""
  for variable in ("TF_CONFIG", "CLUSTER_SPEC"):
    try:
      task = json.loads(environ.get(variable) or "{}").get("task") or {}
    except (ValueError, AttributeError):
      continue
    if task.get("type") is not None:
      return {"task_type": task["type"], "task_index": int(task.get("index", 0))}
  return {}


def configure(log_format: str, environ: Mapping[str, str], stream: TextIO = sys.stderr) -> str:
  """Sets absl's handler (and Python warnings) to the chosen format; returns `json` or `text`."""
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top

  chosen = resolve(log_format, environ, stream)
  if chosen == "json":
    handler = absl_logging.get_absl_handler()
    handler.setFormatter(JsonFormatter(replica_fields(environ)))
    logging.captureWarnings(True)  # warnings.warn(...) lines become records too, at WARNING
  return chosen


def error_line(message: str, log_format: str, environ: Mapping[str, str]) -> str:
  """The one line a user error ends in: `error: ...`, as a JSON ERROR record in json mode."""
  text = f"error: {message}"
  return json_line("ERROR", text, replica_fields(environ)) if log_format == "json" else text
