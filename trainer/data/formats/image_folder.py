"""Image files in one folder per class (what Keras' `image_dataset_from_directory` reads): each file is a record of
two columns, the file's path and its folder's name. Told by the listing (every file an image), not by content."""

from __future__ import annotations

from typing import Any, Iterator

from trainer.data.formats import base


@base.register
class ImageFolderFormat(base.DataFormat):
  name = "image_folder"
  display_name = "images in class folders"
  flag_value = False  # only ever detected (--data_format=auto)
  files_are_records = True

  def claims_listing(self, files: list[str]) -> bool:
    return all(is_image_file(path) for path in files)

  def records(self, path: str, source: base.Source, *, flag: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield "file", {IMAGE_FOLDER_IMAGE: path, IMAGE_FOLDER_LABEL: folder_class(path)}

  def count(self, files: list[str], source: base.Source) -> int:
    return len(files)

  def tf_batches(self, files: list[str], schema, source: base.Source, plan: base.ReadPlan):
    """Batches of {"image": path, "label": folder name}: each file is one record, so the file list itself is
    sharded and shuffled (all of it: a list of paths), and the images are read by the schema's `uri` image
    feature when encoded."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    labels = [folder_class(path) for path in files]
    ds = tf.data.Dataset.from_tensor_slices({IMAGE_FOLDER_IMAGE: files, IMAGE_FOLDER_LABEL: labels})
    if plan.num_pipelines > 1:
      ds = ds.shard(plan.num_pipelines, plan.pipeline_id)
    if plan.shuffle:
      ds = ds.shuffle(len(files), seed=plan.seed, reshuffle_each_iteration=True)
    if plan.repeat:
      ds = ds.repeat()
    return base.batched(ds, plan)

  def tf_batch_parser(self, schema, source: base.Source):
    return lambda columns: base.split_label(columns, schema)


IMAGE_FOLDER = base.Source(ImageFolderFormat.name)
IMAGE_FOLDER_IMAGE, IMAGE_FOLDER_LABEL = "image", "label"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp")


def is_image_file(path: str) -> bool:
  return path.lower().endswith(IMAGE_EXTENSIONS)


# Class folders (Keras' image_dataset_from_directory) often hold a stray file (notes.txt, a labels.csv at the top):
# Keras reads only image files; so does the trainer when at least this share of the listed files are images.
IMAGE_FOLDER_SHARE = 0.9


def image_folder_files(files: list[str]) -> tuple[list[str], list[str]]:
  """(the image files, the other files left out) when the files are mostly images (`IMAGE_FOLDER_SHARE`), else
  (files, [])."""
  images = [path for path in files if is_image_file(path)]
  if images and len(images) < len(files) and len(images) >= IMAGE_FOLDER_SHARE * len(files):
    return images, [path for path in files if not is_image_file(path)]
  return files, []


def folder_class(path: str) -> str:
  """The class of an image in a folder-per-class layout: the name of the folder that holds it."""
  parts = path.rstrip("/").split("/")
  return parts[-2] if len(parts) > 1 else ""
