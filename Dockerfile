# The trainer image for Vertex AI custom jobs (containerSpec pools): TensorFlow and CUDA from the official
# TensorFlow GPU image at the version the project pins and tests (requirements-dev.txt), the trainer from its sdist.
#   python setup.py -q sdist --formats=gztar --dist-dir=dist && docker build -t IMAGE .
#   python -m scripts.submit --config=cloud_configs/single_gpu.yaml --build_image ...   # through Cloud Build
# Nothing in it is specific to one job: the job's args come from the config's containerSpec.args.
ARG TF_VERSION=2.21.0
FROM tensorflow/tensorflow:${TF_VERSION}-gpu

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The sdist is the trainer alone (MANIFEST.in). Its only requirement, absl-py, comes with TensorFlow, so pip
# installs nothing else and never touches the image's TensorFlow. dist/extra/ holds the user's own packages
# (submit --extra_package: a plug-in model), installed beside it; their requirements are theirs.
COPY dist/ /tmp/trainer/
RUN python3 -m pip install /tmp/trainer/*.tar.gz \
    && if [ -d /tmp/trainer/extra ]; then python3 -m pip install /tmp/trainer/extra/*; fi \
    && rm -rf /tmp/trainer

WORKDIR /
ENTRYPOINT ["python3", "-m", "trainer.task"]
