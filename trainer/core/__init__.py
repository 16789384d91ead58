"""The bottom layer: errors and exit codes, the typed configuration, paths and storage (local, gs://, /gcs/), logs
and progress writers, hyperparameters and the tuning service's reporting. Imports nothing else of the trainer."""
