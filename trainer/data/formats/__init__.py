"""Which format and compression the data files are in, and reading, counting and checking them.

Each format is one module of this package with one `base.DataFormat` subclass registered by `@base.register`:
tfrecord, csv, jsonl, parquet, image_folder, bigquery. The package imports every module in it, so a new format
(Avro) is one new file for everything here: detection, description, settling a split's source from its first
file, records in plain Python, counting, the schema check, and the TF input pipeline's raw batches and their
parse (`input_pipeline` asks the class), a record's values in the trainer's value model (`present_value`,
`typed_value`: what pre-flight checks and the Example writer writes), what schema inference observes
(`sampled`, `check_for_inference`), a split's own check (`check_split`), whether parameter-server workers can
read it, and the class attributes pre-flight and inference read (`files_are_records` for class folders,
`splits_by_ml_use` for Vertex's exports, `columns_ordered`). Nothing in the trainer compares format names now.

`--data_format=auto` (the default) resolves in this order: a listing one format claims as a whole
(image files in class folders), Vertex's `AIP_DATA_FORMAT` (a managed-dataset job), the file extension
(`.tfrecord`, `.csv`, `.jsonl`, each optionally `.gz` / `.zz`; `.parquet`), then the first file's content (each
format's `sniff` in its `sniff_order`: Parquet's `PAR1` magic, a TFRecord, JSON, else CSV). Compression is read
from each file's first bytes (`base.compression_of`).
"""

from __future__ import annotations

import importlib
import pkgutil

from trainer.core.errors import UserError
from trainer.data.formats import base
from trainer.data.formats.base import BLANK_LINE  # pylint: disable=unused-import  (the package's API)
from trainer.data.formats.base import ExampleValues  # pylint: disable=unused-import
from trainer.data.formats.base import FIELD_COUNT  # pylint: disable=unused-import
from trainer.data.formats.base import MISSING  # pylint: disable=unused-import
from trainer.data.formats.base import non_finite_problem  # pylint: disable=unused-import
from trainer.data.formats.base import FORMATS
from trainer.data.formats.base import open_text  # pylint: disable=unused-import
from trainer.data.formats.base import read_head  # pylint: disable=unused-import
from trainer.data.formats.base import ReadPlan  # pylint: disable=unused-import
from trainer.data.formats.base import Source
from trainer.data.formats.base import ValueProblem  # pylint: disable=unused-import
from trainer.data.formats.csv import csv_source  # pylint: disable=unused-import
from trainer.data.formats.csv import is_number  # pylint: disable=unused-import
from trainer.data.formats.image_folder import folder_class  # pylint: disable=unused-import
from trainer.data.formats.image_folder import IMAGE_FOLDER  # pylint: disable=unused-import
from trainer.data.formats.image_folder import IMAGE_FOLDER_IMAGE  # pylint: disable=unused-import
from trainer.data.formats.image_folder import IMAGE_FOLDER_LABEL  # pylint: disable=unused-import
from trainer.data.formats.image_folder import image_folder_files  # pylint: disable=unused-import
from trainer.data.formats.image_folder import is_image_file  # pylint: disable=unused-import
from trainer.data.formats.jsonl import count_ml_use  # pylint: disable=unused-import
from trainer.data.formats.jsonl import flatten_json  # pylint: disable=unused-import
from trainer.data.formats.jsonl import ml_use_predicate  # pylint: disable=unused-import
from trainer.data.formats.jsonl import VERTEX_LABEL  # pylint: disable=unused-import
from trainer.data.formats.jsonl import VERTEX_LABELS  # pylint: disable=unused-import
from trainer.data.formats.jsonl import VERTEX_METADATA_PREFIXES  # pylint: disable=unused-import
from trainer.data.formats.jsonl import VERTEX_MULTI_LABEL  # pylint: disable=unused-import
from trainer.data.formats.jsonl import vertex_export_label  # pylint: disable=unused-import
from trainer.data.formats.tfrecord import TFRECORD  # pylint: disable=unused-import

for _module in pkgutil.iter_modules(__path__):  # every format registers itself on import
  importlib.import_module(f"{__name__}.{_module.name}")

# --data_format's values besides "auto"; AIP_DATA_FORMAT values (Vertex managed datasets) -> ours.
FLAG_VALUES = tuple(name for name, data_format in FORMATS.items() if data_format.flag_value)
VERTEX_FORMATS = {vertex_name: name for name, data_format in FORMATS.items()
                  for vertex_name in data_format.vertex_names}


def configure(environ) -> None:
  """Hands each format the run's environment (`DataFormat.configure`), as storage.configure_gcs does for gs://."""
  for data_format in FORMATS.values():
    data_format.configure(environ)


def _extension_format(path: str) -> str | None:
  """The format the file name claims (after an optional compression extension), None where it says nothing."""
  name = path.rsplit("/", 1)[-1].lower()
  for ext in base.COMPRESSED_EXTENSIONS:
    if name.endswith(ext):
      name = name[:-len(ext)]
      break
  return next((data_format.name for data_format in FORMATS.values()
               if any(name.endswith(ext) for ext in data_format.extensions)), None)


def resolve(files: list[str], *, requested: str, vertex_format: str | None, flag: str) -> Source:
  """The format and compression of one split's files (CSV columns are settled later, by `settle`)."""
  for data_format in FORMATS.values():
    if not data_format.reads_files and data_format.claims_listing(files):  # tables by URI: no bytes to read
      if requested not in ("auto", data_format.name):
        raise UserError(f"--data_format={requested} but {flag} names {data_format.display_name}s ({files[0]}); "
                        f"drop --data_format or pass --data_format={data_format.name}")
      return Source(data_format.name)
  if requested == "auto" and not vertex_format:
    for data_format in FORMATS.values():
      if data_format.claims_listing(files):
        return Source(data_format.name)
  compression = base.one_compression(files, flag=flag)
  if requested != "auto":
    data_format = requested
  elif vertex_format:
    data_format = VERTEX_FORMATS[vertex_format]
  else:
    claimed = {}
    for path in files:
      kind = _extension_format(path)
      if kind:
        claimed.setdefault(kind, path)
    if len(claimed) > 1:
      (a, pa), (b, pb) = list(claimed.items())[:2]
      raise UserError(f"{flag}: the pattern mixes {a} ({pa}) and {b} ({pb}) files; point it at one format")
    data_format = next(iter(claimed), None) or _sniff_format(files[0], compression, flag=flag)
  return Source(data_format, compression)


def _sniff_format(path: str, compression: str, *, flag: str) -> str:
  """The first format, in `sniff_order`, whose `sniff` recognises the file's content."""
  sniffers = sorted((f for f in FORMATS.values() if f.sniff_order is not None), key=lambda f: f.sniff_order)
  for data_format in sniffers:
    if data_format.sniff(path, compression, flag=flag):
      return data_format.name
  raise UserError(f"{flag}: {path}: no format recognises it; expected one of {', '.join(FLAG_VALUES)}")


def settle(source: Source, first_file: str, schema=None, *, csv_columns: tuple[str, ...] | None = None,
           csv_multiline: bool | None = None, flag: str) -> Source:
  """The split's source once its first file is read (`DataFormat.settled`: CSV's columns and header)."""
  return FORMATS[source.format].settled(source, first_file, schema, csv_columns=csv_columns,
                                        csv_multiline=csv_multiline, flag=flag)


def source_for(files: list[str], *, requested: str = "auto", columns: tuple[str, ...] | None = None,
               flag: str) -> Source:
  """`resolve`, then `settle` on the first file: how tools outside a training run read a pattern."""
  source = resolve(files, requested=requested, vertex_format=None, flag=flag)
  return settle(source, files[0], csv_columns=columns, flag=flag)


def iter_records(path: str, source: Source, *, flag: str):
  """(where, {column: value}) of each record: `where` is "line N", "record N" or "row N"; values are as the file
  holds them: Example value lists (TFRecord), strings (CSV; "" when empty), JSON values (JSONL), pyarrow's Python
  values (Parquet)."""
  return FORMATS[source.format].records(path, source, flag=flag)


def count_records(files: list[str], source: Source) -> int:
  """Records in `files` (one pass; used to turn --epochs into steps)."""
  return FORMATS[source.format].count(files, source)


def check_strategy(sources: dict[str, Source], *, parameter_server: bool) -> None:
  """Refuses a format the strategy cannot read (under parameter servers, one read by Python)."""
  if parameter_server:
    for source in sources.values():
      problem = FORMATS[source.format].parameter_server_problem()
      if problem:
        raise UserError(problem)


def check_schema(schema, source: Source, files: list[str], *, flag: str) -> None:
  """Refuses a schema these files cannot hold, in one line naming `flag`."""
  if schema.label.multi_label and not FORMATS[source.format].holds_label_lists:
    raise UserError(f"{flag}: label {schema.label.name!r} is multi-label (a list of class names per record), which "
                    f"is read from JSONL (Vertex's multi-label export, or a JSON array of names); this is "
                    f"{source.describe()}")
  FORMATS[source.format].check_schema(schema, source, files, flag=flag)
