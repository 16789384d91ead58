"""Plug-in models written the way the Keras tutorials write them (`--model=tutorial_models:NAME`): probability
outputs, one sigmoid unit, Sequential over one vector of numbers, raw strings looked up inside the model, raw
text vectorized inside the model."""

import keras


def _numeric_size(schema):
  return sum(f.shape[0] if f.shape else 1 for f in schema.features if f.type in ("float", "int"))


def sequential_softmax(schema, hparams):
  """keras.io "classification from scratch": a Sequential over one feature vector, softmax out."""
  del hparams
  return keras.Sequential([keras.Input((_numeric_size(schema),)), keras.layers.Dense(16, activation="relu"),
                           keras.layers.Dense(schema.label.num_classes, activation="softmax")])


def sequential_unbuilt(schema, hparams):
  """No Input at all (built on its first call), ending in a Softmax layer."""
  del hparams
  return keras.Sequential([keras.layers.Dense(16, activation="relu"),
                           keras.layers.Dense(schema.label.num_classes), keras.layers.Softmax()])


def binary_sigmoid(schema, hparams):
  """"Structured data classification": named inputs, one sigmoid unit for a two-class label."""
  del hparams
  inputs = {f.name: keras.Input((), name=f.name) for f in schema.features if f.type != "string"}
  x = keras.layers.Concatenate()([
      keras.layers.Normalization(mean=f.mean or 0.0, variance=(f.std or 1.0) ** 2)(
          keras.layers.Reshape((1,))(inputs[f.name])) for f in schema.features if f.type != "string"])
  x = keras.layers.Dense(16, activation="relu")(x)
  return keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid")(x))


def raw_strings(schema, hparams):
  """Preprocessing inside the model: StringLookup on raw strings, Normalization on numbers; softmax out."""
  del hparams
  inputs, parts = {}, []
  for f in schema.features:
    if f.type == "string":
      inputs[f.name] = keras.Input((), dtype="string", name=f.name)
      ids = keras.layers.StringLookup(vocabulary=list(f.vocabulary))(inputs[f.name])
      parts.append(keras.layers.Embedding(len(f.vocabulary) + 1, 4)(ids))
    else:
      inputs[f.name] = keras.Input((), name=f.name)
      parts.append(keras.layers.Normalization(mean=f.mean or 0.0, variance=(f.std or 1.0) ** 2)(
          keras.layers.Reshape((1,))(inputs[f.name])))
  x = keras.layers.Dense(16, activation="relu")(keras.layers.Concatenate()(parts))
  return keras.Model(inputs, keras.layers.Dense(schema.label.num_classes, activation="softmax")(x))


def sigmoid_over_three(schema, hparams):
  """A multi-label head on a single-label task: refused."""
  del hparams
  return keras.Sequential([keras.Input((_numeric_size(schema),)), keras.layers.Dense(3, activation="sigmoid")])


def text_embedding_bag(schema, hparams):
  """tensorflow.org "Basic text classification", fed by the schema instead of `adapt`: a raw string input,
  TextVectorization to int sequences over the schema's words, Embedding, GlobalAveragePooling1D, softmax out."""
  del hparams
  text = next(f for f in schema.features if f.type == "text")
  inputs = keras.Input(shape=(1,), dtype="string", name=text.name)
  x = keras.layers.TextVectorization(vocabulary=list(text.vocabulary), output_mode="int",
                                     output_sequence_length=text.sequence_length)(inputs)
  x = keras.layers.Embedding(len(text.vocabulary) + 2, 16)(x)
  x = keras.layers.GlobalAveragePooling1D()(keras.layers.Dropout(0.2)(x))
  return keras.Model(inputs, keras.layers.Dense(schema.label.num_classes, activation="softmax")(x))


class DictSoftmax(keras.Model):
  """keras.io "Making new layers and models via subclassing": layers made in __init__, call() over a dict of the
  numeric features by name, softmax out."""

  def __init__(self, schema):
    super().__init__()
    self.numeric = [(f.input_name, f.mean or 0.0, f.std or 1.0) for f in schema.features if f.type in ("float", "int")]
    self.hidden = keras.layers.Dense(16, activation="relu")
    self.out = keras.layers.Dense(schema.label.num_classes, activation="softmax")

  def call(self, features):
    columns = [(keras.ops.reshape(features[name], (-1, 1)) - mean) / std for name, mean, std in self.numeric]
    return self.out(self.hidden(keras.ops.concatenate(columns, axis=-1)))


class VectorHead(keras.Model):
  """The same over one vector of the numeric features, ending in `activation` over `units`."""

  def __init__(self, units, activation=None):
    super().__init__()
    self.hidden = keras.layers.Dense(16, activation="relu")
    self.out = keras.layers.Dense(units, activation=activation)

  def call(self, x):
    return self.out(self.hidden(x))


def subclassed_dict_softmax(schema, hparams):
  del hparams
  return DictSoftmax(schema)


def subclassed_vector_logits(schema, hparams):
  del hparams
  return VectorHead(schema.label.num_classes)


def subclassed_vector_softmax(schema, hparams):
  del hparams
  return VectorHead(schema.label.num_classes, "softmax")


def subclassed_vector_sigmoid(schema, hparams):
  """One sigmoid unit for a two-class label."""
  del hparams
  return VectorHead(1, "sigmoid")
