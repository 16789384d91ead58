"""The models: the built-in models and plug-ins, transfer-learning backbones, the model registry, the training recipe
(losses, metrics, learning-rate schedule, class weights) and the SavedModel export. Imports `trainer.core` and
`trainer.data`."""
