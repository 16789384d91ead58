"""Image-file benchmark: the trainer's pipeline over a CSV of image paths against a plain tf.data pipeline that
reads and decodes the same JPEG files (`read_file` + `decode_jpeg` per element, parallel map, batch), on local disk
and on gs:// (emulated), in one run; memory at 10x the files.

    .venv/bin/python -m scripts.bench.images                       # 4,000 JPEGs of 64x64, batch 128
    .venv/bin/python -m scripts.bench.images --rounds=4 --num_images=1000   # quicker, noisier

The images are scikit-learn's two sample photographs (china.jpg, flower.jpg) cut into 64x64 tiles and saved by
Pillow as JPEG; the CSV (written by pandas) names each file and a label.
- trainer: `input_pipeline.make_dataset_fn` over the CSV (the schema's `uri` image: files read in the graph,
  checked to be images, decoded, cast to float; the shuffle window);
- plain: `Dataset.from_tensor_slices(paths)` -> `map(read_file + decode_jpeg + cast, AUTOTUNE)` -> batch, as the
  tf.data guide writes it (no shuffle, no checks); plain_gcs the same over the gs:// copies;
- gcs: the trainer over the gs:// copies reading every file every time (--uri_cache_mb=0); gcs_cached the same
  with the trainer's default --uri_cache_mb=1024 (files held in memory after their first read: every epoch after
  the first, including the untimed warm-up round's share of it, reads from memory).
It measures as scripts/bench/formats.py does (scripts/bench/harness.py). Nothing here asserts: it reports.
"""

from __future__ import annotations

import argparse
import os

from scripts.bench import harness

BUILDER = "scripts.bench.images:build"
SIDE = 64


def build(kind: str, pattern: str, schema_path: str, batch: int):
  """One pipeline of this benchmark (built in the pipeline's own process)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from trainer.data import schema as schema_lib  # pylint: disable=g-import-not-at-top

  files = sorted(tf.io.gfile.glob(pattern))
  if kind in ("trainer", "gcs", "gcs_cached"):
    cache = (1 << 30) if kind == "gcs_cached" else 0  # --uri_cache_mb=1024, the trainer's default; else 0
    return harness.trainer_pipeline(files, schema_lib.load_schema(schema_path), batch, file_cache_bytes=cache)
  paths = [line.split(",")[0] for line in tf.io.gfile.GFile(files[0]).read().splitlines()[1:]]

  def load(path):
    return tf.cast(tf.io.decode_jpeg(tf.io.read_file(path), channels=3), tf.float32)

  ds = tf.data.Dataset.from_tensor_slices(paths).repeat().map(load, num_parallel_calls=tf.data.AUTOTUNE)
  return ds.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def write_images(directory: str, *, num_images: int, uri_prefix: str | None = None) -> str:
  """JPEG tiles of scikit-learn's sample photos and a CSV naming them (paths as `uri_prefix` names them)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import pandas as pd  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from sklearn.datasets import load_sample_images  # pylint: disable=g-import-not-at-top

  photos = load_sample_images().images
  tiles = [(label, photo[y:y + SIDE, x:x + SIDE]) for label, photo in enumerate(photos)
           for y in range(0, photo.shape[0] - SIDE + 1, SIDE) for x in range(0, photo.shape[1] - SIDE + 1, SIDE)]
  os.makedirs(os.path.join(directory, "images"), exist_ok=True)
  rows = []
  for i in range(num_images):
    label, tile = tiles[i % len(tiles)]
    name = f"images/{i:06d}.jpg"
    Image.fromarray(np.ascontiguousarray(tile)).save(os.path.join(directory, name), format="JPEG", quality=90)
    rows.append({"path": f"{uri_prefix or directory}/{name}", "photo": label})
  pd.DataFrame(rows).to_csv(os.path.join(directory, "images.csv"), index=False)
  return os.path.join(directory, "images.csv")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--num_images", type=int, default=4000)
  harness.add_turn_flags(parser, batch_size=128)
  args = parser.parse_args()

  from scripts import stage_data  # pylint: disable=g-import-not-at-top
  from trainer.core import storage  # pylint: disable=g-import-not-at-top

  with harness.scratch("images") as scratch:
    print(f"writing {args.num_images} JPEG tiles of {SIDE}x{SIDE} (and 10x that) ...", flush=True)
    local = write_images(os.path.join(scratch, "one"), num_images=args.num_images)
    big = write_images(os.path.join(scratch, "ten"), num_images=10 * args.num_images)
    remote_dir = os.path.join(scratch, "remote")
    remote = write_images(remote_dir, num_images=args.num_images, uri_prefix="gs://bench/images")
    schema_path = os.path.join(scratch, "schema.json")
    storage.write_json(schema_path, {
        "features": [{"name": "path", "type": "image", "uri": True, "shape": [SIDE, SIDE, 3], "encoding": "jpeg"}],
        "label": {"name": "photo", "type": "int", "num_classes": 2}})
    with harness.bench_bucket(scratch) as (emulator, env):
      stage_data.upload_tree(remote_dir, "gs://bench/images", client=emulator.storage_client())
      kinds = {"trainer": (local, env), "gcs": (remote, env), "gcs_cached": (remote, env), "plain": (local, env),
               "plain_gcs": (remote, env)}
      rounds = harness.timed_rounds(BUILDER, kinds, schema_path, args.batch_size, rounds=args.rounds,
                                    slice_secs=args.slice_secs)
      memory = [harness.one_pass_rss(BUILDER, "trainer", p, schema_path, args.batch_size,
                                     args.num_images * scale, env) for p, scale in ((local, 1), (big, 10))]

  print(f"\n{args.num_images:,} JPEGs of {SIDE}x{SIDE}, batch {args.batch_size}; {args.rounds} rounds of "
        f"{args.slice_secs:g} s slices; images/s are medians over rounds")
  ratios = (("trainer / plain", "trainer", "plain", 0.9),
            ("trainer / plain, gs://", "gcs", "plain_gcs", 0.9),
            ("gs:// / local", "gcs", "trainer", 0.8),
            ("gs:// held in memory / gs://", "gcs_cached", "gcs", 1.0),
            ("gs:// held in memory / local", "gcs_cached", "trainer", 0.8))
  harness.report(rounds, ratios, memory, unit="images/s")

if __name__ == "__main__":
  main()
