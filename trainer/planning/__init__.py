"""The job before it trains: pre-flight checks of flags, data and outputs, data errors named by file and record, the
one `tf.train.Example` writer, and `Job`, everything a training loop needs, built once. Imports the layers below."""
