"""The environment that keeps every Google client on this machine: no metadata-server probe, no real host.

One table for the emulator, the test helpers and every process they start. `scripts/test.sh` exports the same
three variables in shell, before any Python starts.
"""

LOOPBACK_ENV = {"GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9", "NO_GCE_CHECK": "true"}
