"""Each kind of feature's behaviour in one place: a new kind is one class here (and its tests).

A kind is one schema feature type ("float", "int", "string", "text", "image"). It answers everything the rest of the
trainer asks of a column of that type:
- `holds`: the value one record carries, whatever the file format: "number" (one or N), "string" or "bytes".
  Formats, pre-flight and the Example writer dispatch on it, never on the type's name;
- `settings`: its own keys of a schema.json feature (a vocabulary, a shape, an encoding, ...), checked;
- `example_list`, `parse_dtype` and `parse_shape`: how a `tf.train.Example` (and the other readers) hold it;
- `json_kind`: the JSON value a JSONL line holds for it ("number", "array", "string", "image");
- `model_input`: the shape and dtype of the model input after encoding (Keras inputs, sample batches);
- `serving_input`: the shape and dtype of the serving signature's input (the raw value a request carries);
- `openapi`: the OpenAPI 3.0 schema object of that value in one Vertex instance;
- `encode`: the raw parsed column -> the model input, in the graph (training and serving alike);
- `example_values`: how the one `tf.train.Example` writer (`trainer.planning.examples`) stores a value.

Shapes are per example (no batch dimension); dtypes are TensorFlow dtype names, so this module imports no
TensorFlow until `encode` runs. It sits below `schema`, which asks `KINDS` to parse each feature's settings.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainer.core.errors import DATA_CHECK_PREFIX, UserError

Feature = Any  # a trainer.data.schema.Feature: schema sits above this module (it asks KINDS to parse settings)

IMAGE_ENCODINGS = ("raw", "png", "jpeg", "gif", "bmp")
ENCODED_IMAGES = IMAGE_ENCODINGS[1:]  # image files' bytes, decoded in the input pipeline (any of them, whatever it says)
DEFAULT_SEQUENCE_LENGTH = 64
# What Keras' TextVectorization reserves: index 0 pads, index 1 is the out-of-vocabulary token.
RESERVED_TOKENS = ("", "[UNK]")
NUMBER, STRING, BYTES = "number", "string", "bytes"  # what a record holds for a kind (`Kind.holds`)


@dataclasses.dataclass(frozen=True)
class Spec:
  """A shape per example (no batch dimension) and a TensorFlow dtype name."""

  shape: tuple[int, ...]
  dtype: str


class Kind:
  """The behaviour every kind has; subclasses fill in what differs."""

  type: str = ""
  holds: str = ""  # NUMBER, STRING or BYTES
  example_list: str = ""  # the tf.train.Example list: "float_list", "int64_list" or "bytes_list"
  parse_dtype: str = ""  # the dtype a reader parses one value to
  categorical = False  # one of a vocabulary, looked up as an id
  image = False  # an image (raw pixels or an image file's bytes), checked and decoded as one
  takes_uri = False  # the column may hold file URIs whose bytes are the value (`"uri": true`)

  def settings(self, raw: dict[str, Any], *, name: str, source: str) -> dict[str, Any]:
    """The `Feature` fields this kind reads from a schema.json feature `raw`, checked (`source` names the file)."""
    del raw, name, source
    return {}

  def default(self, value: Any, *, name: str, source: str) -> Any:
    """A feature's `"default"` (the value a missing field takes), checked."""
    textual = self.holds == STRING
    if (self.holds == BYTES or textual != isinstance(value, str)
        or (self.holds == NUMBER and not is_number_value(value))):
      raise UserError(f"schema {source}: feature {name!r} ({self.type}) has default {value!r}; expected "
                      f"{'a string' if textual else 'a number'} (images take no default)")
    return value

  def parse_shape(self, feature: Feature) -> tuple[int, ...]:
    return ()

  def values_per_example(self, feature: Feature) -> int:
    """1 for a scalar; N for a numeric feature of shape [N] (images are one bytes value)."""
    return 1

  def example_values(self, feature: Feature, value: Any) -> list:
    """The values of the Example list for one example's `value`."""
    raise NotImplementedError

  def json_kind(self, feature: Feature) -> str:
    raise NotImplementedError

  def model_input(self, feature: Feature) -> Spec:
    raise NotImplementedError

  def serving_input(self, feature: Feature) -> Spec:
    raise NotImplementedError

  def openapi(self, feature: Feature) -> dict[str, Any]:
    raise NotImplementedError

  def encode(self, feature: Feature, value, *, table=None):
    """The model input for a batch of parsed values (`table`: the feature's vocabulary lookup, if any)."""
    raise NotImplementedError

  def load(self, feature: Feature, value, *, cache: FileCache | None = None):
    """The value a request would carry for a batch of parsed values: for a `uri` feature, the files' bytes (read
    in the input pipeline only, through `cache` if given: serving takes the value itself); else the values
    unchanged."""
    if not feature.uri:
      return value
    return read_files(value, check_image=self.image, name=feature.name, cache=cache)


def is_number_value(value: Any) -> bool:
  """A JSON or Python number as a schema.json value is one (a bool is not)."""
  return isinstance(value, (int, float)) and not isinstance(value, bool)


_NUMBER = {"type": "number", "format": "float"}


class Numeric(Kind):
  """`float` and `int`: one number per example, or N (`"shape": [N]`); standardized by the built-in models."""

  holds = NUMBER

  def __init__(self, type_name: str, *, example_list: str, parse_dtype: str, cast: type):
    self.type, self.example_list, self.parse_dtype, self._cast = type_name, example_list, parse_dtype, cast

  def settings(self, raw, *, name, source):
    shape = raw.get("shape")
    if shape is None:
      return {}
    if not isinstance(shape, list) or len(shape) != 1 or not isinstance(shape[0], int) or shape[0] < 1:
      raise UserError(f"schema {source}: numeric feature {name!r} has shape {shape!r}; expected [N] "
                      "(N values per example)")
    return {"shape": tuple(shape)}

  def default(self, value, *, name, source):
    value = super().default(value, name=name, source=source)
    if self._cast is int and value != int(value):
      raise UserError(f"schema {source}: {self.type} feature {name!r} has default {value!r}; expected an integer")
    return self._cast(value)

  def values_per_example(self, feature):
    return feature.shape[0] if feature.shape else 1

  def parse_shape(self, feature):
    size = self.values_per_example(feature)
    return (size,) if size > 1 else ()

  def example_values(self, feature, value):
    return [self._cast(v) for v in (value if self.values_per_example(feature) > 1 else [value])]

  def json_kind(self, feature):
    return "array" if self.values_per_example(feature) > 1 else "number"

  def model_input(self, feature):
    return Spec(self.parse_shape(feature), "float32")

  def serving_input(self, feature):
    return Spec(self.parse_shape(feature), "float32")

  def openapi(self, feature):
    size = self.values_per_example(feature)
    if size > 1:
      return {"type": "array", "items": dict(_NUMBER), "minItems": size, "maxItems": size}
    return dict(_NUMBER)

  def encode(self, feature, value, *, table=None):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    return tf.cast(value, tf.float32)


class Categorical(Kind):
  """`string`: one of a vocabulary; encoded as an id (0 is out of vocabulary), embedded by the built-in models."""

  type, holds, example_list, parse_dtype = "string", STRING, "bytes_list", "string"
  categorical = True

  def settings(self, raw, *, name, source):
    vocabulary = raw.get("vocabulary")
    if not isinstance(vocabulary, list) or not vocabulary or not all(isinstance(v, str) for v in vocabulary):
      raise UserError(f"schema {source}: string feature {name!r} needs a non-empty 'vocabulary' of strings")
    return {"vocabulary": tuple(vocabulary)}

  def example_values(self, feature, value):
    return [value if isinstance(value, bytes) else str(value).encode()]

  def json_kind(self, feature):
    return "string"

  def model_input(self, feature):
    return Spec((), "int64")

  def serving_input(self, feature):
    return Spec((), "string")

  def openapi(self, feature):
    value: dict[str, Any] = {"type": "string"}
    if feature.vocabulary:
      value["description"] = f"one of {len(feature.vocabulary)} known values; others map to the OOV bucket"
    return value

  def encode(self, feature, value, *, table=None):
    return table.lookup(value)


class Text(Kind):
  """`text`: free text. Every model gets the raw string (the built-in ones tokenize it in the graph with Keras'
  `TextVectorization` over the schema's token vocabulary, which TF Serving runs as plain string and lookup ops)."""

  type, holds, example_list, parse_dtype = "text", STRING, "bytes_list", "string"
  takes_uri = True

  def settings(self, raw, *, name, source):
    """The token vocabulary, sequence length and word pairs, checked."""
    vocabulary = raw.get("vocabulary")
    if (not isinstance(vocabulary, list) or not vocabulary or not all(isinstance(v, str) for v in vocabulary)
        or len(set(vocabulary)) != len(vocabulary)):
      raise UserError(f"schema {source}: text feature {name!r} needs a 'vocabulary': a non-empty list of distinct "
                      "tokens (python -m trainer.schema_inference writes one from the data)")
    # Whitespace as TensorFlow's string split (and so TextVectorization) knows it: ASCII only; a no-break space is
    # part of a token.
    bad = [token for token in vocabulary if token in RESERVED_TOKENS or any(c in " \t\n\r\f\v" for c in token)]
    if bad:
      raise UserError(f"schema {source}: text feature {name!r} has vocabulary entry {bad[0]!r}; tokens hold no "
                      f"whitespace, and {RESERVED_TOKENS[1]!r} and '' are reserved (out of vocabulary, padding)")
    sequence_length = raw.get("sequence_length", DEFAULT_SEQUENCE_LENGTH)
    if not isinstance(sequence_length, int) or isinstance(sequence_length, bool) or sequence_length < 1:
      raise UserError(f"schema {source}: text feature {name!r} has sequence_length {sequence_length!r}; expected a "
                      "positive integer")
    bigrams = raw.get("bigrams")
    if bigrams is not None:
      if (not isinstance(bigrams, list) or not all(isinstance(b, str) for b in bigrams)
          or len(set(bigrams)) != len(bigrams)):
        raise UserError(f"schema {source}: text feature {name!r} has 'bigrams' {str(bigrams)[:80]}; expected a list "
                        "of distinct word pairs, each two tokens and one space between (\"not bad\")")
      bad = [b for b in bigrams if len(b.split(" ")) != 2 or not all(b.split(" "))
             or any(c in "\t\n\r\f\v" for c in b) or any(t in RESERVED_TOKENS for t in b.split(" "))]
      if bad:
        raise UserError(f"schema {source}: text feature {name!r} has bigram {bad[0]!r}; a bigram is two tokens and "
                        "one space between (\"not bad\"), neither token reserved")
      bigrams = tuple(bigrams)
    return {"vocabulary": tuple(vocabulary), "sequence_length": sequence_length, "bigrams": bigrams}

  def example_values(self, feature, value):
    return [value if isinstance(value, bytes) else str(value).encode()]

  def json_kind(self, feature):
    return "string"

  def model_input(self, feature):
    return Spec((), "string")

  def serving_input(self, feature):
    return Spec((), "string")

  def openapi(self, feature):
    return {"type": "string", "description": f"free text; {len(feature.vocabulary)} known words"}

  def encode(self, feature, value, *, table=None):
    return value


# Keras' TextVectorization defaults (standardize="lower_and_strip_punctuation", split="whitespace"), which the
# built-in models use: tf.strings.lower (ASCII letters only), this punctuation removed, split at ASCII whitespace.
TEXT_STRIP_PATTERN = r'[!"#$%&()\*\+,-\./:;<=>?@\[\\\]^_`{|}~\']'
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def text_tokens(text: str) -> list[str]:
  """The tokens Keras' default TextVectorization makes of `text`, in plain Python (schema inference)."""
  import re  # pylint: disable=g-import-not-at-top

  stripped = re.sub(TEXT_STRIP_PATTERN, "", text.translate(_ASCII_LOWER))
  return [token for token in re.split(r"[ \t\n\r\f\v]+", stripped) if token]


class Image(Kind):
  """`image`: raw uint8 bytes of the schema's shape, or PNG/JPEG bytes decoded (and resized) in the graph."""

  type, holds, example_list, parse_dtype = "image", BYTES, "bytes_list", "string"
  takes_uri = image = True

  def settings(self, raw, *, name, source):
    shape = raw.get("shape")
    if not isinstance(shape, list) or len(shape) != 3 or not all(isinstance(d, int) and d > 0 for d in shape):
      raise UserError(f"schema {source}: image feature {name!r} needs 'shape': [height, width, channels], "
                      f"got {shape!r}")
    encoding = raw.get("encoding", "raw")
    if encoding not in IMAGE_ENCODINGS:
      raise UserError(f"schema {source}: image feature {name!r} has encoding {encoding!r}; expected one of "
                      f"{', '.join(IMAGE_ENCODINGS)}")
    if encoding != "raw" and shape[2] not in (1, 3, 4):
      raise UserError(f"schema {source}: image feature {name!r} is {encoding} with {shape[2]} channels; "
                      "expected 1, 3 or 4")
    if raw.get("uri") and encoding == "raw":
      encoding = "jpeg"  # files are encoded images; decode_image reads PNG, JPEG, GIF and BMP alike
    max_value = raw.get("max_value")
    if max_value is not None and not (is_number_value(max_value) and max_value > 0):
      raise UserError(f"schema {source}: image feature {name!r} has max_value {max_value!r}; expected a "
                      "positive number")
    return {"shape": tuple(shape), "encoding": encoding, "max_value": None if max_value is None else float(max_value)}

  def example_values(self, feature, value):
    return [value if isinstance(value, bytes) else value.tobytes()]

  def json_kind(self, feature):
    return "string" if feature.uri else "image"

  def model_input(self, feature):
    return Spec(tuple(feature.shape), "float32")

  def serving_input(self, feature):
    if feature.encoding in ENCODED_IMAGES:
      # An image file's bytes; in Vertex's JSON instances {"b64": "..."}, which TF Serving decodes for string inputs.
      return Spec((), "string")
    return Spec(tuple(feature.shape), "float32")

  def openapi(self, feature):
    if feature.encoding in ENCODED_IMAGES:
      # Binary strings travel as {"b64": ...} in Vertex's JSON instances.
      return {"type": "object", "required": ["b64"], "properties": {"b64": {"type": "string", "format": "byte"}},
              "description": "an image file's bytes (PNG, JPEG, GIF or BMP), base64"}
    shaped: dict[str, Any] = dict(_NUMBER)
    for size in reversed(feature.shape or ()):
      shaped = {"type": "array", "items": shaped, "minItems": size, "maxItems": size}
    return shaped

  def encode(self, feature, value, *, table=None):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if value.dtype == tf.string:
      value = _decode_images(value, feature)
    return tf.cast(value, tf.float32)


# The first bytes of the image files decode_image reads: PNG, JPEG, GIF, BMP.
_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF8", b"BM")


class FileCache:
  """The bytes of the files `uri` features name, kept in memory after their first read, up to about `max_bytes`
  (then files not yet held are read every time they come up).

  Why: a Cloud Storage object costs a request (tens of milliseconds, and an operation billed) however small it is;
  training on images or texts by URI reads every file once per epoch, so from the second epoch on a dataset that
  fits is read from memory (scripts/bench/images.py measures both). The bound is approximate: a batch's files are
  kept when the bytes held so far plus theirs fit, counted without a lock across parallel batches. One cache per
  input pipeline (built inside `dataset_fn`, as the vocabulary tables are)."""

  _HELD = "bytes held"  # the one key of the byte count's table (a table, not a variable: no strategy variable)

  def __init__(self, max_bytes: int):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    self._max_bytes = max_bytes
    # TensorFlow has no mutable string -> string table on CPU: the key is the URI's 63-bit hash, and the value
    # holds the URI itself before the bytes, so a hash shared by two URIs reads as "not held", never as the
    # other file.
    self._contents = tf.lookup.experimental.MutableHashTable(tf.int64, tf.string, default_value="")
    self._held = tf.lookup.experimental.MutableHashTable(tf.string, tf.int64, default_value=0)

  def read(self, uris):
    """The bytes of each file of a batch of URIs: held ones from memory, the others read (and kept if they fit)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    keys = tf.strings.to_hash_bucket_fast(uris, 2**63 - 1)
    prefixes = uris + "\0"
    stored = tf.reshape(self._contents.lookup(keys), tf.shape(keys))  # the lookup forgets the shape
    prefix_lengths = tf.strings.length(prefixes)
    hit = tf.strings.substr(stored, tf.zeros_like(prefix_lengths), prefix_lengths) == prefixes
    missing = tf.logical_not(hit)
    missing_uris = tf.boolean_mask(uris, missing)
    fresh = _read_each(missing_uris)
    hits = tf.boolean_mask(stored, hit)
    positions = tf.range(tf.shape(uris, out_type=tf.int32)[0])
    contents = tf.dynamic_stitch([tf.boolean_mask(positions, hit), tf.boolean_mask(positions, missing)],
                                 [tf.strings.substr(hits, tf.boolean_mask(prefix_lengths, hit),
                                                    tf.strings.length(hits)), fresh])
    total = self._held.lookup(tf.constant([self._HELD]))[0] + tf.reduce_sum(
        tf.cast(tf.strings.length(fresh), tf.int64))

    def keep():
      with tf.control_dependencies([self._contents.insert(tf.boolean_mask(keys, missing),
                                                          tf.boolean_mask(prefixes, missing) + fresh),
                                    self._held.insert(tf.constant([self._HELD]), tf.reshape(total, [1]))]):
        return tf.constant(True)

    kept = tf.cond(total <= self._max_bytes, keep, lambda: tf.constant(False))
    with tf.control_dependencies([kept]):
      return tf.identity(contents)


def read_files(uris, *, check_image: bool, name: str, cache: FileCache | None = None):
  """The bytes of each file a batch of URIs names (gs://, /gcs/ read as gs://, local), read in parallel in the
  graph (through `cache` when given). A missing file fails with TensorFlow's NotFoundError naming it; an image
  file that is not PNG, JPEG, GIF or BMP fails a data check naming it (decode_image's own error does not)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  uris = tf.strings.regex_replace(uris, "^/gcs/", "gs://")
  if cache is not None:
    contents = cache.read(uris)
  else:
    contents = _read_each(uris)
  if not check_image:
    return contents
  known = [tf.equal(tf.strings.substr(contents, 0, len(magic)), magic) for magic in _IMAGE_MAGIC]
  bad = tf.logical_not(tf.reduce_any(tf.stack(known), axis=0))
  check = tf.debugging.Assert(tf.logical_not(tf.reduce_any(bad)), [
      f"{DATA_CHECK_PREFIX} {URI_PROBLEM} column {name!r} names a file that is not a PNG, JPEG, GIF or "
      "BMP image:", tf.boolean_mask(uris, bad)[:1]])
  with tf.control_dependencies([check]):
    return tf.identity(contents)


def _read_each(uris):
  """Each file's bytes, 32 reads in flight (a Cloud Storage read is mostly waiting)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  return tf.map_fn(tf.io.read_file, uris, fn_output_signature=tf.string, parallel_iterations=32)


URI_PROBLEM = "[uri]"  # marks a data check about a file a column names: data_errors reports it as it is


def _decode_images(data, feature: Feature):
  """uint8 or float32 [batch, height, width, channels] from raw bytes or image files' bytes, PNG, JPEG, GIF (its
  first frame) or BMP (resized to the schema's shape where an image differs, as Keras'
  image_dataset_from_directory does)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  height, width, channels = feature.shape
  if feature.encoding in (None, "raw"):
    return tf.reshape(tf.io.decode_raw(data, tf.uint8), (-1,) + feature.shape)

  def decode_gif_or_bmp(one):
    # Their decoders give 3 (or 4) channels only: RGB, then the schema's channels.
    image = tf.io.decode_image(one, channels=3, expand_animations=False)
    return tf.image.rgb_to_grayscale(image) if channels == 1 else image

  def decode(one):
    gif_or_bmp = tf.logical_or(tf.equal(tf.strings.substr(one, 0, 4), b"GIF8"),
                               tf.equal(tf.strings.substr(one, 0, 2), b"BM"))
    image = tf.cond(gif_or_bmp, lambda: decode_gif_or_bmp(one),
                    lambda: tf.io.decode_image(one, channels=channels, expand_animations=False))
    image = tf.ensure_shape(image, [None, None, channels])
    same = tf.reduce_all(tf.shape(image)[:2] == [height, width])
    image = tf.cond(same, lambda: tf.cast(image, tf.float32),
                    lambda: tf.image.resize(tf.cast(image, tf.float32), [height, width]))
    return tf.ensure_shape(image, feature.shape)

  return tf.map_fn(decode, data, fn_output_signature=tf.TensorSpec(feature.shape, tf.float32), parallel_iterations=32)


KINDS: dict[str, Kind] = {kind.type: kind for kind in (
    Numeric("float", example_list="float_list", parse_dtype="float32", cast=float),
    Numeric("int", example_list="int64_list", parse_dtype="int64", cast=int),
    Categorical(), Text(), Image())}


def register(kind: Kind) -> Kind:
  """Adds a kind (its `type` becomes a schema feature type); returns it."""
  KINDS[kind.type] = kind
  return kind
