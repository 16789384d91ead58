"""The trainer package Vertex AI installs on its prebuilt TensorFlow images.

    python setup.py sdist --formats=gztar     # dist/vertex-tf-trainer-<version>.tar.gz

Only `trainer/` is packaged. TensorFlow, Keras and protobuf are deliberately NOT requirements: the prebuilt
images bring their own, and reinstalling them would break the image. For local use install
`requirements-dev.txt` (or the `tf` extra).
"""

import re

import setuptools

with open("trainer/__init__.py") as f:
  VERSION = re.search(r'__version__ = "([^"]+)"', f.read()).group(1)

setuptools.setup(
    name="vertex-tf-trainer",
    version=VERSION,
    description="Train TensorFlow models on Vertex AI custom jobs under any tf.distribute strategy.",
    packages=setuptools.find_packages(include=["trainer", "trainer.*"]),
    python_requires=">=3.10",
    # absl-py ships with TensorFlow; listed with a floor only, so pip never replaces the image's copy.
    install_requires=["absl-py>=1.0"],
    # tfx: read a TFX / TFDV schema.pbtxt (--schema=...pbtxt); parquet: read Parquet files; bigquery: read bq://
    # tables (the Storage Read API, as Arrow). Nothing else needs them.
    extras_require={"tf": ["tensorflow>=2.16"], "tfx": ["tensorflow-metadata>=1.16"], "parquet": ["pyarrow>=14"],
                    "bigquery": ["google-cloud-bigquery-storage>=2.24", "pyarrow>=14"]},
    entry_points={"console_scripts": ["vertex-tf-trainer=trainer.task:entry"]},
)
