"""scikit-learn as the trainer image has it: absent.

The trainer image is `tensorflow/tensorflow:<version>-gpu` plus the trainer (Dockerfile), which holds no
scikit-learn; the dev venv holds it for the tests' baselines and public datasets. Keras 3 imports scikit-learn (and
pandas with it) at `import tensorflow` whenever it is importable, for its `keras.wrappers`: 0.6-0.9 s of CPU in
every process, which the image does not pay. `procs.trainer_env` puts this directory first on a trainer
process's path, so the trainer processes tests start import what the image's would.
"""

raise ImportError("scikit-learn is not in the trainer image (tests/trainer_image/sklearn)")
