"""The cluster and its strategy: TF_CONFIG / CLUSTER_SPEC parsing, the `tf.distribute` strategy it calls for, the
fit plan (loop x strategy), peer watching, preemption, parameter servers and who owns which output. Imports only
`trainer.core`."""
