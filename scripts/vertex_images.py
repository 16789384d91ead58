"""Vertex AI's prebuilt TensorFlow images and their end-of-availability dates: the one table every command reads.

Read 2026-12-06 from Vertex's supported-frameworks page (training and prediction containers) and Google's framework
support policy: past its end of availability an image is no longer usable, and `pythonPackageSpec.executorImageUri`
must name one of Vertex's prebuilt training images. The newest TensorFlow training images (2.17, Python 3.10) ended
on 2026-07-11 and no newer one exists, so today the trainer runs on Vertex in its own image (the Dockerfile, run
through `containerSpec`). Re-read the page when Vertex lists a new image and update this table.
"""

from __future__ import annotations

import dataclasses
import datetime

READ_ON = datetime.date(2026, 12, 6)
SOURCE = "Vertex AI's supported-frameworks page, read 2026-12-06"


@dataclasses.dataclass(frozen=True)
class PrebuiltImage:
  tf_version: str  # "2.17"
  python: str  # "3.10"
  end_of_availability: datetime.date


# Training images by the `2-NN` in their name (tf-cpu.2-17.py310, tf-gpu.2-17.py310). 2.16's date is no longer on
# the page; it left no later than 2.17.
TRAINING = {
    "2-17": PrebuiltImage("2.17", "3.10", datetime.date(2026, 7, 11)),
    "2-16": PrebuiltImage("2.16", "3.10", datetime.date(2026, 7, 11)),
}
# Prediction images (tf2-cpu.2-NN, tf2-gpu.2-NN) by minor version: none newer than 2.15 is listed.
PREDICTION = {
    15: PrebuiltImage("2.15", "3.10", datetime.date(2027, 1, 14)),
}
# How long before its end an image in use is warned about.
WARN_DAYS = 90

TRAINER_IMAGE_INSTEAD = ("run the trainer image instead: a containerSpec with imageUri ${TRAINER_IMAGE}, as every "
                         "config in cloud_configs/ has (python -m scripts.submit builds it from the Dockerfile)")
