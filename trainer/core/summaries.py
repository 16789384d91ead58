"""TensorBoard scalars, written by the chief only.

Built on `tf.summary.write` with the scalar plugin's metadata (what `tf.summary.scalar` attaches), so the
trainer needs no `tensorboard` package: TF >= 2.21 no longer pulls it in, and Vertex's images need nothing new.
"""

from __future__ import annotations

from typing import Iterable, Mapping


def _scalar_metadata() -> bytes:
  from tensorflow.core.framework import summary_pb2  # pylint: disable=g-import-not-at-top

  return summary_pb2.SummaryMetadata(
      plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
      data_class=summary_pb2.DATA_CLASS_SCALAR).SerializeToString()


class Summaries:
  """One event-file writer per split under `directory`; a no-op when not `enabled`."""

  def __init__(self, directory: str, *, enabled: bool, splits: Iterable[str] = ("train", "eval")):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    self._metadata = _scalar_metadata()
    self._writers = {}
    if enabled:
      self._writers = {name: tf.summary.create_file_writer(f"{directory.rstrip('/')}/{name}") for name in splits}

  def scalars(self, split: str, step: int, values: Mapping[str, float]) -> None:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    writer = self._writers.get(split)
    if writer is None:
      return
    with writer.as_default(step=step):
      for name, value in values.items():
        tf.summary.write(name, tf.constant(value, tf.float32), metadata=self._metadata)
    writer.flush()

  def close(self) -> None:
    for writer in self._writers.values():
      writer.close()
