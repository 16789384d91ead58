"""The data: formats (detection, reading, counting, sampling), the schema and its feature kinds, schema inference,
the `tf.data` input pipeline and the prediction schemata. Imports only `trainer.core`."""
