"""Build the trainer sdist, stage it to a bucket and submit a Vertex AI job from a cloud_configs/ file.

    python -m scripts.submit --config=cloud_configs/multi_worker_gpu.yaml \\
        --project=my-project --region=us-central1 --bucket=my-bucket [--args=--train_steps=5000] [--env=K=V]
    python -m scripts.submit --config=... --dry_run     # print the request and the gcloud command; send nothing
    python -m scripts.submit --config=cloud_configs/container_single_gpu.yaml ... --build_image --upload_model

The config is validated (scripts/vertex_config.py) before anything is built or uploaded. A custom-job config
becomes a CustomJob, an hp-tuning config a HyperparameterTuningJob, submitted through google-cloud-aiplatform's
JobService; the command then follows the job's state until it ends (--no_follow returns at once).
Values not given as flags come from the environment (PROJECT, REGION, BUCKET, TRAINER_IMAGE).

containerSpec configs run the trainer image: --trainer_image names it (default
REGION-docker.pkg.dev/PROJECT/vertex-tf-trainer/trainer:VERSION); --build_image first builds and pushes it from
the Dockerfile through Cloud Build (scripts/cloud_build.py) and the job then runs that exact build, by digest.
--upload_model registers the SavedModel in Model Registry once the job has succeeded (scripts/registry.py), served
by the project's serving image (Dockerfile.serving, TF matching the training TF; --build_serving_image builds and
pushes it through Cloud Build first, and the model then names that exact build), or --serving_image=prebuilt for
Vertex's prebuilt TF prediction image (a warning when it is past, or near, its end of availability).
"""

from __future__ import annotations

import argparse
import copy
import glob
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from scripts import clients
from scripts import cloud_build
from scripts import registry
from scripts import vertex_config
from trainer import paths

TERMINAL_STATES = {"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"}


class SubmitError(RuntimeError):
  """A one-line reason the submission cannot go ahead."""


def build_sdist(out_dir: str) -> str:
  """`python setup.py sdist` of the trainer; returns the archive path. setuptools makes its release tree
  (vertex-tf-trainer-<version>/) and egg-info in the checkout itself, so two builds at once (two submits, or
  tests in parallel) would delete each other's files: one build at a time per machine."""
  import fcntl  # pylint: disable=g-import-not-at-top

  with open(os.path.join(tempfile.gettempdir(), "vertex-tf-trainer-sdist.lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    result = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--formats=gztar", "--dist-dir", out_dir],
                            cwd=REPO, capture_output=True, text=True, check=False)
  if result.returncode:
    raise SubmitError(f"building the sdist failed: {result.stderr.strip().splitlines()[-1:]}")
  (archive,) = glob.glob(os.path.join(out_dir, "*.tar.gz"))
  return archive


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
  """Lists `uris` after the trainer's in every Python-package pool's packageUris (Vertex installs them all)."""
  if uris and any((pool or {}).get("containerSpec") and vertex_config.trainer_spec(pool)
                  for pool in body.get("workerPoolSpecs", [])):
    raise SubmitError("--extra_package applies to pythonPackageSpec pools; a containerSpec pool runs what its "
                      "image holds: add your package to the Dockerfile (COPY and pip install it) instead")
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
  from trainer.errors import UserError  # pylint: disable=g-import-not-at-top

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
  parser.add_argument("--project", default=os.environ.get("PROJECT"))
  parser.add_argument("--region", default=os.environ.get("REGION", "us-central1"))
  parser.add_argument("--bucket", default=os.environ.get("BUCKET"), help="staging and output bucket (no gs://)")
  parser.add_argument("--display_name", default=None)
  parser.add_argument("--run_id", default=None, help="fills ${RUN_ID} (default: time stamp)")
  parser.add_argument("--args", action="append", default=[], help="extra trainer arg (repeatable)")
  parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for every trainer replica")
  parser.add_argument("--image", default=None, help="override both CPU and GPU executor images")
  parser.add_argument("--trainer_image", default=os.environ.get("TRAINER_IMAGE"),
                      help="the trainer image containerSpec pools run (fills ${TRAINER_IMAGE})")
  parser.add_argument("--build_image", action="store_true",
                      help="build and push the trainer image from the Dockerfile through Cloud Build first")
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
                           "setup.py, or a built sdist/wheel; staged next to the trainer, listed in packageUris")
  parser.add_argument("--dry_run", action="store_true", help="print the request and gcloud command; send nothing")
  parser.add_argument("--no_follow", action="store_true")
  parser.add_argument("--api_endpoint", default=os.environ.get("VERTEX_API_ENDPOINT"), help=argparse.SUPPRESS)
  parser.add_argument("--poll_secs", type=float, default=30.0)
  parser.add_argument("--timeout_secs", type=float, default=7 * 24 * 3600)
  args = parser.parse_args(argv)
  try:
    return _submit(args)
  except (SubmitError, vertex_config.ConfigError, registry.RegistryError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


def _submit(args) -> int:
  if not args.project:
    raise SubmitError("--project is required (or set PROJECT)")
  if not args.bucket:
    raise SubmitError("--bucket is required (or set BUCKET): the sdist is staged there")
  args.bucket = vertex_config.bucket_name(args.bucket)
  run_id = args.run_id or time.strftime("%Y%m%d-%H%M%S")
  display_name = args.display_name or f"{os.path.splitext(os.path.basename(args.config))[0]}-{run_id}"
  env = parse_env(args.env)
  if args.upload_model and args.no_follow:
    raise SubmitError("--upload_model waits for the job to succeed; drop --no_follow (or upload later with "
                      "--upload_model on a dry run's printed request)")
  with tempfile.TemporaryDirectory(prefix="submit-") as scratch:
    # Validate with a placeholder package first: a bad config fails before anything is built or uploaded.
    values = vertex_config.values_from(os.environ, project=args.project, region=args.region, bucket=args.bucket,
                                       run_id=run_id, cpu_image=args.image, gpu_image=args.image,
                                       trainer_image=args.trainer_image)
    pending = vertex_config.load(args.config, {**values, "PACKAGE_URI": f"gs://{args.bucket}/staging/pending.tar.gz"})
    checked = apply_overrides(pending, args.args, env)
    check_trainer_args(checked, pending.kind)
    if pending.kind == "hp_tuning":
      check_study(checked, args.config)
    pools = pending.job_spec["workerPoolSpecs"]
    containers = bool(pools[0].get("containerSpec"))
    if args.build_image and not containers:
      raise SubmitError(f"--build_image: {args.config} runs pythonPackageSpec pools on a prebuilt image; the trainer "
                        "image is for containerSpec configs (cloud_configs/container_*.yaml)")
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
    build_request = context = context_uri = None
    serving_build = serving_context = serving_context_uri = None
    if args.build_serving_image:
      serving_context = cloud_build.build_context(archive, scratch, serving=True)
      serving_context_uri = f"gs://{args.bucket}/staging/{os.path.basename(serving_context)}"
      serving_build = cloud_build.build_request(project=args.project, region=args.region,
                                                image=container["imageUri"], context_uri=serving_context_uri,
                                                tf_version=registry.serving_tf_version(training_tf))
    if args.build_image:
      context = cloud_build.build_context(archive, scratch)
      context_uri = f"gs://{args.bucket}/staging/{os.path.basename(context)}"
      build_request = cloud_build.build_request(project=args.project, region=args.region,
                                                image=values.get("TRAINER_IMAGE") or vertex_config.default_trainer_image(
                                                    args.project, args.region), context_uri=context_uri)
    if pending.kind == "hp_tuning" and not check_study(checked, args.config, packages=[a for a, _ in extras]):
      print("warning: the trials' --model is not importable here (pass its package with --extra_package): the "
            "study's parameters were checked against the trainer's own flags only", file=sys.stderr)
    config = vertex_config.load(args.config, {**values, "PACKAGE_URI": uri})
    body = apply_overrides(config, args.args, env)
    add_package_uris(body["trialJobSpec"] if config.kind == "hp_tuning" else body, [u for _, u in extras])
    request = request_for(config.kind, body, display_name)
    for warning in config.warnings:
      print(f"warning: {warning}", file=sys.stderr)
    if args.dry_run:
      rendered = os.path.join(tempfile.gettempdir(), f"{display_name}.yaml")
      import yaml  # pylint: disable=g-import-not-at-top
      with open(rendered, "w") as f:
        yaml.safe_dump(body, f, sort_keys=False)
      printed = {"parent": parent, "package": {"local": "(built at submit time)", "uri": uri},
                 "extra_packages": [{"local": a, "uri": u} for a, u in extras], "request": request}
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
      first = (f"build and push the trainer image ({'the build above' if build_request else 'Dockerfile'})"
               if containers else f"upload the sdist to {uri}")
      print(f"# config written to {rendered}; {first}, then:")
      print(gcloud_command(config.kind, project=args.project, region=args.region, display_name=display_name,
                           config_file=rendered))
      return 0
    for warning in serving_warnings if upload_request else ():
      print(f"warning: {warning}", file=sys.stderr)
    contexts = [(c, u) for c, u in ((context, context_uri), (serving_context, serving_context_uri)) if c]
    for local, remote in [(archive, uri), *extras, *contexts]:
      upload(local, remote)
      print(f"staged {os.path.basename(local)} -> {remote}", flush=True)
    if serving_build:
      built_serving = _build(serving_build, "--build_serving_image", args.api_endpoint)
      container.update(registry.serving_spec(built_serving))  # the model names exactly this build, by digest
    if build_request:
      built = _build(build_request, "--build_image", args.api_endpoint)
      # The job runs exactly this build: the image by digest, in every trainer pool.
      config = vertex_config.load(args.config, {**values, "PACKAGE_URI": uri, "TRAINER_IMAGE": built})
      body = apply_overrides(config, args.args, env)
      request = request_for(config.kind, body, display_name)
    client = job_client(args.region, args.api_endpoint)
    job = create_job(client, config.kind, parent, request)
    print(f"submitted {job.name}", flush=True)
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


def _build(request: dict, flag: str, api_endpoint: str | None) -> str:
  """Runs one Cloud Build request to its end, saying so; returns the pushed image by digest."""
  print(f"building {request['build']['images'][0]} with Cloud Build ...", flush=True)
  try:
    built = cloud_build.run_build(cloud_build.build_client(api_endpoint), request)
  except RuntimeError as e:
    raise SubmitError(f"{flag}: {e}") from None
  print(f"built {built}", flush=True)
  return built


def _deploy_requests(args, display_name: str):
  """DeployModelRequest bodies for --deploy (checked now: the endpoint's name, replicas, traffic on a new one)."""
  if args.endpoint and not re.fullmatch(r"projects/[^/]+/locations/[^/]+/endpoints/[^/]+", args.endpoint):
    raise SubmitError(f"--endpoint={args.endpoint!r}: expected projects/P/locations/L/endpoints/N")

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
