"""Vertex AI training package for TensorFlow: `python -m trainer.task --help`."""

__version__ = "0.1.0"
