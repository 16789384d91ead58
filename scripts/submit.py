"""Submit a Vertex AI job from a cloud_configs/ file, running the trainer image.

    python -m scripts.submit --config=cloud_configs/multi_worker_gpu.yaml --bucket=my-bucket \\
        [--project=my-project] [--region=us-central1] [--args=--train_steps=5000] [--env=K=V]
    python -m scripts.submit --config=... --dry_run     # print the requests and the gcloud command; send nothing
    python -m scripts.submit --config=cloud_configs/single_gpu.yaml --bucket=B --upload_model --deploy

The config is validated (scripts/vertex_config.py) before anything is built or uploaded. A custom-job config
becomes a CustomJob, an hp-tuning config a HyperparameterTuningJob, submitted through google-cloud-aiplatform's
JobService; the command prints the job's console page and follows its state until it ends (--no_follow returns at
once). The project and region come from the flags, else the environment or gcloud's configuration
(scripts/gcp_context.py); BUCKET and TRAINER_IMAGE from the environment.

Every config in cloud_configs/ runs the trainer image (containerSpec): Vertex has no prebuilt TensorFlow training
image any more (scripts/vertex_images.py). By default that is the Dockerfile's image in the project's Artifact
Registry repository vertex-tf-trainer (made on first use), tagged `src-<digest>` by what it is built from (the
sdist's files, the --extra_package archives, the Dockerfile, the TF version): an image of that tag is reused, else
Cloud Build builds it (scripts/cloud_build.py); the job names it by digest. --trainer_image runs an image as it is;
--build_image builds even when the tag exists. A pythonPackageSpec config of one's own is still taken while its
prebuilt image is available, its sdist staged to the bucket.
--upload_model registers the SavedModel in Model Registry once the job has succeeded (scripts/registry.py), served
by the project's serving image (Dockerfile.serving, TF matching the training TF; --build_serving_image builds and
pushes it through Cloud Build first, and the model then names that exact build), or --serving_image=prebuilt for
Vertex's prebuilt TF prediction image (refused past its end of availability). A model exported earlier is
registered with python -m scripts.register_model.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from scripts import artifact_registry
from scripts import clients
from scripts import cloud_build
from scripts import gcp_context
from scripts import registry
from scripts import vertex_config
from trainer.core import paths

RENDERED_DIR = "vertex_jobs"  # a dry run's filled config (and image build context), under the current directory
TERMINAL_STATES = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"}


class SubmitError(RuntimeError):
  """A one-line reason the submission cannot go ahead."""


def build_sdist(out_dir: str) -> str:
  """`python setup.py sdist` of the trainer; returns the archive path. setuptools makes its release tree
  (vertex-tf-trainer-<version>/) and egg-info in the checkout itself, so two builds at once (two submits, or
  tests in parallel) would delete each other's files: one build at a time per checkout, under a lock on its
  setup.py (not a file in the temp dir, which differs between processes that set TMPDIR)."""
  import fcntl  # pylint: disable=g-import-not-at-top

  with open(os.path.join(REPO, "setup.py")) as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    result = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--formats=gztar", "--dist-dir", out_dir],
                            cwd=REPO, capture_output=True, text=True, check=False)
  if result.returncode:
    raise SubmitError(f"building the sdist failed: {result.stderr.strip().splitlines()[-1:]}")
  (archive,) = glob.glob(os.path.join(out_dir, "*.tar.gz"))
  _make_reproducible(archive)
  return archive


# The time every entry of the sdist carries: $SOURCE_DATE_EPOCH (the reproducible-builds convention), else
# 1980-01-01, the earliest a zip can hold, so the bytes never depend on when files were checked out or touched.
_DEFAULT_SOURCE_DATE = 315532800


def _make_reproducible(archive: str) -> None:
  """Rewrites the sdist so the same tree gives the same bytes: entries sorted, one fixed time, no owner, plain
  modes, and a gzip header without a time or name. setuptools writes each file's checkout time and the build
  time, so every build was a new archive and a new content-addressed copy in the bucket (`package_uri`)."""
  import gzip  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top
  import tarfile  # pylint: disable=g-import-not-at-top

  mtime = int(os.environ.get("SOURCE_DATE_EPOCH", _DEFAULT_SOURCE_DATE))
  with tarfile.open(archive, "r:gz") as source:
    entries = [(member, source.extractfile(member).read() if member.isfile() else None)
               for member in source.getmembers()]
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as target:
    for member, data in sorted(entries, key=lambda entry: entry[0].name):
      member.mtime, member.uid, member.gid, member.uname, member.gname = mtime, 0, 0, "", ""
      member.mode = 0o755 if member.isdir() or member.mode & 0o111 else 0o644
      member.pax_headers = {}
      target.addfile(member, io.BytesIO(data) if data is not None else None)
  with open(archive, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as compressed:
    compressed.write(buffer.getvalue())


PACKAGE_ARCHIVES = (".tar.gz", ".zip", ".whl")


def build_extra_package(path: str, out_dir: str) -> str:
  """--extra_package: a built sdist/wheel as it is, or a project directory (pyproject.toml or setup.py) built
  into a wheel with the local toolchain (no build isolation: nothing is fetched). Returns the archive."""
  if os.path.isfile(path):
    if not path.endswith(PACKAGE_ARCHIVES):
      raise SubmitError(f"--extra_package={path}: not a package archive; expected a directory with pyproject.toml "
                        f"or setup.py, or a built {', '.join(PACKAGE_ARCHIVES)}")
    return path
  if not os.path.isdir(path):
    raise SubmitError(f"--extra_package={path}: no such file or directory")
  if not any(os.path.exists(os.path.join(path, name)) for name in ("pyproject.toml", "setup.py")):
    raise SubmitError(f"--extra_package={path}: the directory has no pyproject.toml or setup.py to build it from")
  wheel_dir = tempfile.mkdtemp(prefix="wheel-", dir=out_dir)
  result = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", "-w", wheel_dir, path], capture_output=True, text=True, check=False)
  if result.returncode:
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    raise SubmitError(f"--extra_package={path}: building it failed ({lines[-1].strip() if lines else 'pip wheel'})")
  (archive,) = glob.glob(os.path.join(wheel_dir, "*.whl"))
  return archive


def add_package_uris(body: dict, uris: list[str]) -> None:
  """Lists `uris` after the trainer's in every Python-package pool's packageUris (Vertex installs them all). A
  containerSpec pool runs what its image holds: there the packages go into the trainer image's build instead."""
  for pool in body.get("workerPoolSpecs", []):
    spec = (pool or {}).get("pythonPackageSpec")
    if spec is not None:
      spec["packageUris"] = list(spec.get("packageUris", [])) + [u for u in uris if u not in spec.get("packageUris", [])]


def stage_extra_packages(paths_given: list[str], bucket: str, out_dir: str) -> list[tuple[str, str]]:
  """(archive, gs:// URI) for each --extra_package, built and named by content like the trainer's sdist."""
  return [(archive, package_uri(bucket, archive, suffix=_archive_suffix(archive)))
          for archive in (build_extra_package(p, out_dir) for p in paths_given)]


def _archive_suffix(archive: str) -> str:
  return next(s for s in PACKAGE_ARCHIVES if archive.endswith(s))


def package_uri(bucket: str, archive: str, *, suffix: str = ".tar.gz") -> str:
  """Content-addressed staging path, so a job always runs exactly the code it was submitted with."""
  with open(archive, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()[:12]
  base = os.path.basename(archive)
  if suffix == ".whl":  # a wheel's file name is parsed by pip: the digest goes in a directory instead
    return f"gs://{bucket}/staging/{digest}/{base}"
  name = base[:-len(suffix)] + f"-{digest}{suffix}"
  return f"gs://{bucket}/staging/{name}"


def upload(archive: str, uri: str, *, client=None) -> None:
  from google.cloud import storage  # pylint: disable=g-import-not-at-top

  bucket_name, blob_name = paths.split_gcs_uri(uri)
  client = client or storage.Client(project=os.environ.get("PROJECT", "local-project"))
  client.bucket(bucket_name).blob(blob_name).upload_from_filename(archive)


def apply_overrides(config: vertex_config.JobConfig, extra_args: list[str], env: dict[str, str]) -> dict:
  """The job body with extra trainer args and env appended to every trainer pool."""
  body = copy.deepcopy(config.body)
  spec = body["trialJobSpec"] if config.kind == "hp_tuning" else body
  for pool in spec["workerPoolSpecs"]:
    package = vertex_config.trainer_spec(pool)  # pythonPackageSpec or containerSpec
    if not package:
      continue
    package["args"] = list(package.get("args", [])) + list(extra_args)
    existing = [e for e in package.get("env", []) if e["name"] not in env]
    package["env"] = existing + [{"name": k, "value": v} for k, v in env.items()]
    if not package["env"]:
      del package["env"]
  return body


def check_trainer_args(body: dict, kind: str) -> None:
  """Every trainer pool's args, checked as the trainer will check them, before anything is built or sent."""
  from trainer import flags as trainer_flags  # pylint: disable=g-import-not-at-top
  from trainer.core.errors import UserError  # pylint: disable=g-import-not-at-top

  spec = body["trialJobSpec"] if kind == "hp_tuning" else body
  for index, pool in enumerate(spec["workerPoolSpecs"]):
    package = vertex_config.trainer_spec(pool)
    if package:
      try:
        trainer_flags.check_args(list(package.get("args", [])), where=f"workerpool{index}")
      except UserError as e:
        raise SubmitError(str(e)) from None


def check_study(body: dict, path: str, *, packages: list[str] = ()) -> bool:
  """A tuning config's StudySpec, and every value a trial can get checked as the trainer will check it; with
  `packages` (the built --extra_package archives), against the plug-in model they hold. False when the model is a
  plug-in that could not be imported (then only the trainer's own flags were judged)."""
  from scripts import study_spec  # pylint: disable=g-import-not-at-top
  from scripts.localrun import install  # pylint: disable=g-import-not-at-top

  with tempfile.TemporaryDirectory(prefix="study-check-") as site:
    for archive in packages:  # installed as Vertex installs packageUris, to read the model's HPARAMS
      try:
        install.pip_install(archive, site, what=f"{archive} to check the study")
      except install.LocalRunError as e:
        raise SubmitError(str(e)) from None
    try:
      spec = study_spec.parse(body, path)
      return study_spec.check_trial_values(spec, study_spec.trainer_args(body), site=site if packages else None)
    except study_spec.StudyError as e:
      raise SubmitError(str(e)) from None


def request_for(kind: str, body: dict, display_name: str) -> dict:
  """The JSON body of the create request, as the REST API takes it."""
  if kind == "hp_tuning":
    return {"displayName": display_name, **body}
  return {"displayName": display_name, "jobSpec": body}


def gcloud_command(kind: str, *, project: str, region: str, display_name: str, config_file: str) -> str:
  group = "hp-tuning-jobs" if kind == "hp_tuning" else "custom-jobs"
  return (f"gcloud ai {group} create --project={shlex.quote(project)} --region={shlex.quote(region)} "
          f"--display-name={shlex.quote(display_name)} --config={shlex.quote(config_file)}")


def job_client(region: str, api_endpoint: str | None):
  from google.cloud import aiplatform_v1  # pylint: disable=g-import-not-at-top

  return aiplatform_v1.JobServiceClient(**clients.vertex_kwargs(region, api_endpoint))


def create_job(client, kind: str, parent: str, request: dict):
  from google.cloud import aiplatform_v1  # pylint: disable=g-import-not-at-top
  from google.protobuf import json_format  # pylint: disable=g-import-not-at-top

  if kind == "hp_tuning":
    job = aiplatform_v1.HyperparameterTuningJob()
    json_format.ParseDict(request, job._pb)  # pylint: disable=protected-access
    return client.create_hyperparameter_tuning_job(parent=parent, hyperparameter_tuning_job=job)
  job = aiplatform_v1.CustomJob()
  json_format.ParseDict(request, job._pb)  # pylint: disable=protected-access
  return client.create_custom_job(parent=parent, custom_job=job)


def follow(client, kind: str, name: str, *, poll_secs: float, timeout_secs: float) -> str:
  get = client.get_hyperparameter_tuning_job if kind == "hp_tuning" else client.get_custom_job
  deadline = time.monotonic() + timeout_secs
  last = None
  while True:
    state = get(name=name).state.name
    if state != last:
      print(f"{time.strftime('%H:%M:%S')} {name}: {state}", flush=True)
      last = state
    if state in TERMINAL_STATES or time.monotonic() > deadline:
      return state
    time.sleep(poll_secs)


def parse_env(pairs: list[str]) -> dict[str, str]:
  env = {}
  for pair in pairs:
    key, sep, value = pair.partition("=")
    if not sep or not key:
      raise SubmitError(f"--env expects KEY=VALUE, got {pair!r}")
    env[key] = value
  return env


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--config", required=True, help="a file in cloud_configs/")
  parser.add_argument("--project", default=None, help=gcp_context.PROJECT_HELP)
  parser.add_argument("--region", default=None, help=gcp_context.REGION_HELP)
  parser.add_argument("--bucket", default=os.environ.get("BUCKET"), help="staging and output bucket (no gs://)")
  parser.add_argument("--service_account", default=None,
                      help="the service account every replica runs as (the job's serviceAccount; default: Vertex's "
                           "Custom Code Service Agent)")
  parser.add_argument("--tensorboard", default=None, metavar="projects/P/locations/L/tensorboards/ID",
                      help="a Vertex AI TensorBoard instance the job streams its TensorBoard logs (and profiler "
                      "traces) into, as it runs; needs --service_account")
  parser.add_argument("--display_name", default=None)
  parser.add_argument("--run_id", default=None, help="fills ${RUN_ID} (default: time stamp)")
  parser.add_argument("--args", action="append", default=[], help="extra trainer arg (repeatable)")
  parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for every trainer replica")
  parser.add_argument("--image", default=None, help="override both CPU and GPU executor images (pythonPackageSpec)")
  parser.add_argument("--trainer_image", default=os.environ.get("TRAINER_IMAGE"),
                      help="run this image in containerSpec pools, as it is (default: the Dockerfile's image in "
                           f"REGION-docker.pkg.dev/PROJECT/{artifact_registry.REPOSITORY}/trainer, tagged by the "
                           "source it is built from: built through Cloud Build unless that tag exists)")
  parser.add_argument("--build_image", action="store_true",
                      help="build and push the trainer image through Cloud Build even when an image of the same "
                           "source exists (with --trainer_image: build it under that name)")
  parser.add_argument("--upload_model", action="store_true",
                      help="after the job succeeds, register its SavedModel in Vertex AI Model Registry")
  parser.add_argument("--serving_image", default=None,
                      help="the model's serving container: default the project's serving image (Dockerfile.serving, "
                      "TF matching the training TF); 'prebuilt' for Vertex's prebuilt TF prediction image; or a URI")
  parser.add_argument("--deploy", action="store_true",
                      help="after --upload_model, deploy the model to an endpoint (a new one, or --endpoint)")
  parser.add_argument("--endpoint", default=None, help="--deploy into this endpoint (projects/P/locations/L/endpoints/N)")
  parser.add_argument("--deploy_machine_type", default="n1-standard-4")
  parser.add_argument("--min_replicas", type=int, default=1)
  parser.add_argument("--max_replicas", type=int, default=1)
  parser.add_argument("--traffic_percent", type=int, default=100,
                      help="the new model's share of the endpoint's traffic; the others keep theirs of the rest")
  parser.add_argument("--build_serving_image", action="store_true",
                      help="build and push the project's serving image through Cloud Build before the job")
  parser.add_argument("--model_display_name", default=None, help="Model Registry name (default: the job's)")
  parser.add_argument("--extra_package", action="append", default=[], metavar="PATH",
                      help="your own package for every replica (repeatable): a directory with pyproject.toml or "
                           "setup.py, or a built sdist/wheel; built into the trainer image (containerSpec) or "
                           "staged next to the trainer and listed in packageUris (pythonPackageSpec)")
  parser.add_argument("--dry_run", action="store_true",
                      help="print the requests and the gcloud command, write the config it names; send nothing")
  parser.add_argument("--rendered_config", default=None, metavar="PATH",
                      help="--dry_run: where to write the filled config the gcloud command names (default: "
                           "vertex_jobs/DISPLAY_NAME.yaml under the current directory, the image build context "
                           "beside it)")
  parser.add_argument("--no_follow", action="store_true")
  parser.add_argument("--api_endpoint", default=os.environ.get("VERTEX_API_ENDPOINT"), help=argparse.SUPPRESS)
  parser.add_argument("--poll_secs", type=float, default=30.0)
  parser.add_argument("--timeout_secs", type=float, default=7 * 24 * 3600)
  args = parser.parse_args(argv)
  try:
    return _submit(args)
  except (SubmitError, vertex_config.ConfigError, registry.RegistryError, artifact_registry.RepositoryError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


_SERVICE_ACCOUNT = re.compile(r"^[a-z0-9][a-z0-9._-]*@[a-z0-9][a-z0-9.-]*\.[a-z]+$")


def set_service_account(body: dict, kind: str, account: str | None) -> None:
  """The job's serviceAccount: every replica (every trial's) runs with its credentials."""
  if not account:
    return
  if not _SERVICE_ACCOUNT.match(account):
    raise SubmitError(f"--service_account={account!r} is not a service account e-mail; expected "
                      "NAME@PROJECT.iam.gserviceaccount.com")
  (body["trialJobSpec"] if kind == "hp_tuning" else body)["serviceAccount"] = account


def console_url(job_name: str) -> str:
  """The job's page in the Cloud console, in the shape google-cloud-aiplatform's own `_dashboard_uri` prints."""
  match = re.match(r"^projects/([^/]+)/locations/([^/]+)/\w+/([^/]+)$", job_name)
  if not match:
    return ""
  project, location, job_id = match.groups()
  return f"https://console.cloud.google.com/agent-platform/locations/{location}/training/{job_id}?project={project}"


@dataclasses.dataclass
class TrainerImage:
  """The image the job's containerSpec pools run."""

  target: str  # the name it is pushed (or was given) under
  build: bool  # build it through Cloud Build (else it exists, or it is the user's own image)
  reuse_if_tagged: bool  # look the target's tag up first and run what it names, by digest, when it exists


def plan_trainer_image(*, trainer_image: str | None, build_image: bool, project: str, region: str, archive: str,
                       extras: list[str]) -> TrainerImage:
  """--trainer_image as it is; else the Dockerfile's image tagged by the source it is built from, reused when
  Artifact Registry has that tag (the same sdist, extra packages, Dockerfile and TF), built otherwise."""
  if trainer_image:
    return TrainerImage(trainer_image, build=build_image, reuse_if_tagged=False)
  digest = cloud_build.source_digest(archive, extras=tuple(extras))
  target = vertex_config.default_trainer_image(project, region, tag=f"src-{digest}")
  return TrainerImage(target, build=True, reuse_if_tagged=not build_image)


def trainer_image_build(image: TrainerImage, archive: str, extras: list[str], *, project: str, region: str,
                        bucket: str, scratch: str) -> tuple[str, str, dict]:
  """The build context (the Dockerfile, the sdist, the extra packages), where it is staged, and the Cloud Build
  request that builds `image` from it."""
  context = cloud_build.build_context(archive, scratch, extras=tuple(extras))
  context_uri = f"gs://{bucket}/staging/{os.path.basename(context)}"
  return context, context_uri, cloud_build.build_request(project=project, region=region, image=image.target,
                                                         context_uri=context_uri)


_TENSORBOARD = re.compile(r"^projects/[^/]+/locations/([^/]+)/tensorboards/[^/]+$")


def set_tensorboard(body: dict, kind: str, name: str | None, *, region: str) -> None:
  """The job's `tensorboard` (every trial's, for a study): Vertex AI then sets AIP_TENSORBOARD_LOG_DIR and streams
  what the chief writes there into that Vertex AI TensorBoard instance, profiler traces included. Checks a name
  the config gives as well as the flag's: its form, its region (the job's own), and the service account Vertex
  requires for it."""
  spec = body["trialJobSpec"] if kind == "hp_tuning" else body
  if name:
    spec["tensorboard"] = name
  name = spec.get("tensorboard")
  if not name:
    return
  found = _TENSORBOARD.match(name)
  if not found:
    raise SubmitError(f"--tensorboard={name!r}: expected projects/PROJECT/locations/REGION/tensorboards/ID, a "
                      "Vertex AI TensorBoard instance's resource name (gcloud ai tensorboards list --region=REGION)")
  if found.group(1) != region:
    raise SubmitError(f"--tensorboard={name!r} is in {found.group(1)}, the job runs in {region}: a job writes only "
                      "to a TensorBoard instance of its own region")
  if not spec.get("serviceAccount"):
    raise SubmitError("--tensorboard needs --service_account: Vertex AI uploads a job's TensorBoard logs only as a "
                      "service account of the job's own (with roles/aiplatform.user and write access to the bucket)")


def _submit(args) -> int:
  project = gcp_context.project(args.project)
  if project is None:
    raise SubmitError(f"{gcp_context.MISSING_PROJECT} (or set PROJECT)")
  region = gcp_context.region(args.region)
  args.project, args.region = project.value, region.value
  if not args.bucket:
    raise SubmitError("--bucket is required (or set BUCKET): the sdist is staged there")
  args.bucket = vertex_config.bucket_name(args.bucket)
  run_id = args.run_id or time.strftime("%Y%m%d-%H%M%S")
  display_name = args.display_name or f"{os.path.splitext(os.path.basename(args.config))[0]}-{run_id}"
  env = parse_env(args.env)
  if args.upload_model and args.no_follow:
    raise SubmitError("--upload_model waits for the job to succeed; drop --no_follow (or upload later with "
                      "python -m scripts.register_model)")
  with tempfile.TemporaryDirectory(prefix="submit-") as scratch:
    # Validate with a placeholder package first: a bad config fails before anything is built or uploaded.
    values = vertex_config.values_from(os.environ, project=args.project, region=args.region, bucket=args.bucket,
                                       run_id=run_id, cpu_image=args.image, gpu_image=args.image,
                                       trainer_image=args.trainer_image)
    pending = vertex_config.load(args.config, {**values, "PACKAGE_URI": f"gs://{args.bucket}/staging/pending.tar.gz"})
    checked = apply_overrides(pending, args.args, env)
    set_service_account(checked, pending.kind, args.service_account)
    set_tensorboard(checked, pending.kind, args.tensorboard, region=args.region)
    check_trainer_args(checked, pending.kind)
    if pending.kind == "hp_tuning":
      check_study(checked, args.config)
    pools = pending.job_spec["workerPoolSpecs"]
    containers = bool(pools[0].get("containerSpec"))
    if args.build_image and not containers:
      raise SubmitError(f"--build_image: {args.config} runs pythonPackageSpec pools on a prebuilt image; the trainer "
                        "image is for containerSpec configs (every config in cloud_configs/)")
    if args.trainer_image and containers and not args.build_image:
      _check_image_name(args.trainer_image)
    arm = vertex_config.arm_pools(pending.job_spec)
    if arm and containers and not args.trainer_image:
      index, machine = arm[0]
      raise SubmitError(f"{args.config}: workerPoolSpecs[{index}] runs on {machine}, an Arm (aarch64) host; the "
                        f"trainer image (Dockerfile, FROM tensorflow/tensorflow:{vertex_config.TRAINER_IMAGE_TF}"
                        ".x-gpu) is built for x86-64 and would not start there: pass --trainer_image=an arm64 image "
                        "with TensorFlow, CUDA and this trainer installed, or use an x86-64 machine (a4-highgpu-8g "
                        "for B200)")
    if arm and containers:
      print(f"warning: workerPoolSpecs[{arm[0][0]}] runs on {arm[0][1]}, an Arm host: --trainer_image="
            f"{args.trainer_image} must be built for linux/arm64", file=sys.stderr)
    parent = f"projects/{args.project}/locations/{args.region}"
    upload_request = None
    if args.upload_model:  # made (and checked) now; sent with the job's name once it has succeeded
      base = pending.job_spec.get("baseOutputDirectory", {}).get("outputUriPrefix", "")
      training_tf = training_tf_of(pools[0])

      if args.build_serving_image and args.serving_image:
        raise SubmitError(f"--build_serving_image builds the project's serving image; --serving_image="
                          f"{args.serving_image} names another: drop one")
      container, serving_warnings = registry.serving_container(args.serving_image, training_tf=training_tf,
                                                               project=args.project, region=args.region)
      if not args.serving_image and not args.build_serving_image:
        serving_warnings.append(f"the model will name {container['imageUri']}, which must exist in Artifact "
                                "Registry when it is deployed: add --build_serving_image once per TF version")

      def upload_request_for(job_name: str) -> dict:
        return registry.upload_request(
            parent=parent, display_name=args.model_display_name or display_name,
            model_dir=f"{base.rstrip('/')}/model/" if base else "", container=container, job_name=job_name,
            run_id=run_id, training_tf=training_tf, config_path=args.config)

      upload_request = upload_request_for("(the job, once submitted)")
      deploy_request_for = _deploy_requests(args, display_name) if args.deploy else None
    elif args.build_serving_image or args.serving_image or args.deploy:
      flag = ("--build_serving_image" if args.build_serving_image else "--serving_image" if args.serving_image
              else "--deploy")
      raise SubmitError(f"{flag} is for the model --upload_model registers; add --upload_model")
    archive = build_sdist(scratch)
    uri = package_uri(args.bucket, archive)
    extras = stage_extra_packages(args.extra_package, args.bucket, scratch)
    serving_build = serving_context = serving_context_uri = None
    if args.build_serving_image:
      serving_context = cloud_build.build_context(archive, scratch, serving=True)
      serving_context_uri = f"gs://{args.bucket}/staging/{os.path.basename(serving_context)}"
      serving_build = cloud_build.build_request(project=args.project, region=args.region,
                                                image=container["imageUri"], context_uri=serving_context_uri,
                                                tf_version=registry.serving_tf_version(training_tf))
    image = plan_trainer_image(trainer_image=args.trainer_image, build_image=args.build_image, project=args.project,
                               region=args.region, archive=archive, extras=[a for a, _ in extras]) \
        if containers else None
    context = context_uri = build_request = None
    if image and image.build:
      context, context_uri, build_request = trainer_image_build(
          image, archive, [a for a, _ in extras], project=args.project, region=args.region, bucket=args.bucket,
          scratch=scratch)
    if pending.kind == "hp_tuning" and not check_study(checked, args.config, packages=[a for a, _ in extras]):
      print("warning: the trials' --model is not importable here (pass its package with --extra_package): the "
            "study's parameters were checked against the trainer's own flags only", file=sys.stderr)

    def job_request(trainer_image: str | None) -> tuple[vertex_config.JobConfig, dict, dict]:
      filled = {**values, "PACKAGE_URI": uri, **({"TRAINER_IMAGE": trainer_image} if trainer_image else {})}
      config = vertex_config.load(args.config, filled)
      body = apply_overrides(config, args.args, env)
      set_service_account(body, config.kind, args.service_account)
      set_tensorboard(body, config.kind, args.tensorboard, region=args.region)
      add_package_uris(body["trialJobSpec"] if config.kind == "hp_tuning" else body, [u for _, u in extras])
      return config, body, request_for(config.kind, body, display_name)

    config, body, request = job_request(image.target if image else None)
    print(f"project {project}, region {region}", file=sys.stderr)  # once every check has passed
    for warning in config.warnings:
      print(f"warning: {warning}", file=sys.stderr)
    if args.dry_run:
      rendered = args.rendered_config or os.path.join(os.getcwd(), RENDERED_DIR, f"{display_name}.yaml")
      import yaml  # pylint: disable=g-import-not-at-top
      try:
        os.makedirs(os.path.dirname(os.path.abspath(rendered)), exist_ok=True)
        with open(rendered, "w") as f:
          yaml.safe_dump(body, f, sort_keys=False)
      except OSError as e:
        raise SubmitError(f"--rendered_config={rendered}: cannot write it ({e.strerror})") from None
      printed = {"parent": parent, "request": request}
      if not containers:  # a container holds its packages; a Python-package pool installs them from the bucket
        printed.update(package={"local": "(built at submit time)", "uri": uri},
                       extra_packages=[{"local": a, "uri": u} for a, u in extras])
      if image:
        printed["trainer_image"] = {
            "image": image.target,
            "how": ("reused by digest if Artifact Registry has this tag (the same source), else built" if
                    image.reuse_if_tagged else "built through Cloud Build" if image.build else "run as given")}
      if build_request:
        printed["build"] = {"context": context_uri, "request": build_request}
      if serving_build:
        printed["build_serving_image"] = {"context": serving_context_uri, "request": serving_build}
      if upload_request:
        printed["upload_model"] = upload_request
      if upload_request and deploy_request_for:
        printed["deploy_model"] = deploy_request_for(args.endpoint or "(a new endpoint)", {})
      for warning in serving_warnings if upload_request else ():
        print(f"warning: {warning}", file=sys.stderr)
      print(json.dumps(printed, indent=2))
      # As written when given; the default (under the current directory) relative to it.
      shown = rendered if args.rendered_config else os.path.relpath(rendered)
      if build_request:  # what Cloud Build would build, unpacked beside the config: `gcloud builds submit` takes it
        context_dir = os.path.splitext(shown)[0] + "-trainer-image"
        shutil.rmtree(context_dir, ignore_errors=True)
        with tarfile.open(context) as tar:  # made by cloud_build.build_context a moment ago
          tar.extractall(context_dir, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        print(f"# config written to {shown}, the trainer image's build context to {context_dir}/; by hand, build "
              "the image (unless Artifact Registry has this tag already), then submit the job:")
        print(f"gcloud builds submit {context_dir} --project={args.project} --region={args.region} "
              f"--tag={image.target}")
      else:
        first = f"push the trainer image {image.target} (as given)" if image else f"upload the sdist to {uri}"
        print(f"# config written to {shown}; {first}, then:")
      print(gcloud_command(config.kind, project=args.project, region=args.region, display_name=display_name,
                           config_file=shown))
      return 0
    for warning in serving_warnings if upload_request else ():
      print(f"warning: {warning}", file=sys.stderr)
    built = None
    if image and image.build:
      built = existing_or_built(image, build_request, context, context_uri, api_endpoint=args.api_endpoint)
    contexts = [(c, u) for c, u in ((serving_context, serving_context_uri),) if c]
    staged = [(archive, uri), *extras] if not containers else []  # a container holds its packages
    for local, remote in [*staged, *contexts]:
      upload(local, remote)
      print(f"staged {os.path.basename(local)} -> {remote}", flush=True)
    if serving_build:
      built_serving = _build(serving_build, "--build_serving_image", args.api_endpoint)
      container.update(registry.serving_spec(built_serving))  # the model names exactly this build, by digest
    if built:  # the job runs exactly this image, by digest, in every trainer pool
      config, body, request = job_request(built)
    client = job_client(args.region, args.api_endpoint)
    job = create_job(client, config.kind, parent, request)
    print(f"submitted {job.name}", flush=True)
    url = console_url(job.name)
    if url:
      print(f"console: {url}", flush=True)
    if args.no_follow:
      return 0
    state = follow(client, config.kind, job.name, poll_secs=args.poll_secs, timeout_secs=args.timeout_secs)
    if state != "JOB_STATE_SUCCEEDED":
      return 1
    if upload_request:
      upload_request = upload_request_for(job.name)
      model = registry.upload(registry.model_client(args.region, args.api_endpoint), upload_request)
      print(f"registered {model} (serving image {upload_request['model']['containerSpec']['imageUri']})", flush=True)
      if deploy_request_for:
        endpoint, deployed_id = registry.deploy(
            registry.endpoint_client(args.region, args.api_endpoint), parent=parent, endpoint=args.endpoint,
            display_name=args.model_display_name or display_name,
            request_for=lambda endpoint, current: deploy_request_for(endpoint, current, model))
        print(f"deployed {model} to {endpoint} (deployed model {deployed_id}, {args.traffic_percent}% of its "
              "traffic)", flush=True)
    return 0


def _check_image_name(image: str) -> None:
  if not re.match(r"^[a-z0-9.-]+(?::\d+)?/[\w./-]+(?::[\w.-]+|@sha256:[0-9a-f]{64})?$", image):
    raise SubmitError(f"--trainer_image={image!r} is not an image name; expected e.g. "
                      f"REGION-docker.pkg.dev/PROJECT/{artifact_registry.REPOSITORY}/trainer:TAG")


def existing_or_built(image: TrainerImage, build_request: dict, context: str, context_uri: str, *,
                      api_endpoint: str | None) -> str:
  """The trainer image by digest: the one Artifact Registry already holds under the target's tag (same source),
  else a new Cloud Build of it (its context staged first). The repository is made on first use."""
  name = artifact_registry.ImageName.parse(image.target)
  if name is not None:
    registry_client = artifact_registry.client(api_endpoint)
    if artifact_registry.ensure_repository(registry_client, name):
      print(f"created the Artifact Registry repository {name.repository_name}", flush=True)
    if image.reuse_if_tagged:
      existing = artifact_registry.find_tag(registry_client, name, name.tag)
      if existing:
        print(f"reusing {existing} ({name.uri}:{name.tag}: built from the same source)", flush=True)
        return existing
  upload(context, context_uri)
  print(f"staged {os.path.basename(context)} -> {context_uri}", flush=True)
  return _build(build_request, "--build_image", api_endpoint)


def _build(request: dict, flag: str, api_endpoint: str | None) -> str:
  """Runs one Cloud Build request to its end, saying so; returns the pushed image by digest."""
  try:
    return cloud_build.build_and_say(request, api_endpoint)
  except RuntimeError as e:
    raise SubmitError(f"{flag}: {e}") from None


def _deploy_requests(args, display_name: str):
  """DeployModelRequest bodies for --deploy (checked now: the endpoint's name, replicas, traffic on a new one)."""
  if args.endpoint:
    args.endpoint = registry.endpoint_name(args.endpoint, project=args.project, region=args.region)

  def request_for(endpoint: str, current: dict, model: str = "(the registered model)") -> dict:
    return registry.deploy_request(
        endpoint=endpoint, model=model, display_name=args.model_display_name or display_name,
        machine_type=args.deploy_machine_type, min_replicas=args.min_replicas, max_replicas=args.max_replicas,
        split=registry.traffic_split(current, args.traffic_percent))

  # An existing endpoint's split is read when deploying; a new endpoint's only model must take all its traffic.
  request_for(args.endpoint or "(a new endpoint)", {"(deployed)": 100} if args.endpoint else {})
  return request_for


def training_tf_of(pool: dict) -> str:
  """The TF version a trainer pool runs: the prebuilt image's, or the trainer image's (Dockerfile)."""
  package = pool.get("pythonPackageSpec")
  if package:
    info = vertex_config.prebuilt_image_info(package["executorImageUri"])
    if info:
      return info[0]
  return ".".join(cloud_build.dockerfile_tf_version().split(".")[:2])


if __name__ == "__main__":
  sys.exit(main())
