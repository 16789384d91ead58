"""A local stand-in for Vertex AI's REST control plane (the one thing that cannot run here).

It records every request and answers like the real API enough for the clients to proceed: creates return the
resource with a name, gets walk a job through RUNNING to SUCCEEDED; Model Registry's `models:upload`, Cloud
Build's `builds` (same endpoint here), `endpoints` and `endpoints/N:deployModel` answer with a finished
long-running operation (a deployment is recorded on the endpoint with its traffic split). Nothing else is
emulated.
"""

from __future__ import annotations

import contextlib
import http.server
import itertools
import json
import re
import threading
from typing import Iterator


class FakeVertex:
  def __init__(self):
    self.requests: list[dict] = []
    self.resources: dict[str, dict] = {}
    self._ids = itertools.count(1000)
    self._gets: dict[str, int] = {}
    self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
    self.port = self._server.server_address[1]
    self.endpoint = f"http://127.0.0.1:{self.port}"
    self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

  def created(self, collection: str) -> list[dict]:
    """Bodies of the POSTs that created resources of `collection` (customJobs, pipelineJobs, schedules...)."""
    return [r["body"] for r in self.requests if r["method"] == "POST" and r["collection"] == collection]

  def push_image(self, image: str, digest: str) -> None:
    """Records an Artifact Registry image `REGION-docker.pkg.dev/P/REPO/PACKAGE:TAG` as pushed (its repository too),
    as Artifact Registry's API then answers for it."""
    match = re.match(r"^([a-z0-9-]+)-docker\.pkg\.dev/([^/]+)/([^/]+)/([^:@]+):([\w.-]+)$", image)
    if not match:
      return
    location, project, repository, package, tag = match.groups()
    repo = f"projects/{project}/locations/{location}/repositories/{repository}"
    self.resources.setdefault(repo, {"name": repo, "format": "DOCKER"})
    package_name = f"{repo}/packages/{package.replace('/', '%2F')}"
    self.resources[f"{package_name}/tags/{tag}"] = {"name": f"{package_name}/tags/{tag}",
                                                     "version": f"{package_name}/versions/{digest}"}

  def _handler(self):
    fake = self

    class Handler(http.server.BaseHTTPRequestHandler):
      def log_message(self, *args):  # quiet
        pass

      def _reply(self, code: int, value: dict) -> None:
        payload = json.dumps(value).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

      def do_POST(self):  # noqa: N802
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        path = self.path.split("?")[0]
        method = re.match(r"^/v1/(projects/[^/]+/locations/[^/]+/(\w+)/\d+):(\w+)$", path)
        if method:  # a method on a resource: endpoints/N:deployModel
          name, collection = method.group(1), f"{method.group(2)}:{method.group(3)}"
          fake.requests.append({"method": "POST", "path": self.path, "collection": collection, "body": body})
          operation = f"{name}/operations/{next(fake._ids)}"
          if collection == "endpoints:deployModel" and name in fake.resources:
            deployed = {**body["deployedModel"], "id": str(next(fake._ids))}
            endpoint = fake.resources[name]
            endpoint.setdefault("deployedModels", []).append(deployed)
            endpoint["trafficSplit"] = {(deployed["id"] if k == "0" else k): v
                                        for k, v in body.get("trafficSplit", {}).items()}
            return self._reply(200, {"name": operation, "done": True, "response": {
                "@type": "type.googleapis.com/google.cloud.aiplatform.v1.DeployModelResponse",
                "deployedModel": deployed}})
          return self._reply(404, {"error": {"code": 404, "message": f"no route {path}"}})
        match = re.match(r"^/v1(?:beta1)?/(projects/[^/]+/locations/[^/]+)/(\w+)(?::(\w+))?$", path)
        if not match:
          return self._reply(404, {"error": {"code": 404, "message": f"no route {path}"}})
        collection = match.group(2) + (f":{match.group(3)}" if match.group(3) else "")
        fake.requests.append({"method": "POST", "path": self.path, "collection": collection, "body": body})
        name = f"{match.group(1)}/{match.group(2)}/{next(fake._ids)}"
        operation = f"{match.group(1)}/operations/{next(fake._ids)}"
        if collection == "models:upload":
          return self._reply(200, {"name": operation, "done": True, "response": {
              "@type": "type.googleapis.com/google.cloud.aiplatform.v1.UploadModelResponse", "model": name}})
        if collection == "repositories":  # Artifact Registry: named by the request's repositoryId
          query = dict(q.split("=", 1) for q in self.path.partition("?")[2].split("&") if "=" in q)
          name = f"{match.group(1)}/repositories/{query.get('repositoryId', '')}"
          fake.resources[name] = {**body, "name": name}
          return self._reply(200, {"name": operation, "done": True, "response": {
              "@type": "type.googleapis.com/google.devtools.artifactregistry.v1.Repository", **fake.resources[name]}})
        if collection == "builds":
          image = body.get("images", [""])[0]
          fake.push_image(image, "sha256:" + "ab" * 32)  # what Cloud Build pushes, Artifact Registry then lists
          return self._reply(200, {"name": operation, "done": True, "response": {
              "@type": "type.googleapis.com/google.devtools.cloudbuild.v1.Build", **body, "id": name.rsplit("/", 1)[1],
              "status": "SUCCESS", "results": {"images": [{"name": image, "digest": "sha256:" + "ab" * 32}]}}})
        resource = {**body, "name": name}
        if collection == "endpoints":  # created by a long-running operation, finished at once here
          fake.resources[name] = resource
          return self._reply(200, {"name": operation, "done": True, "response": {
              "@type": "type.googleapis.com/google.cloud.aiplatform.v1.Endpoint", **resource}})
        if collection in ("customJobs", "hyperparameterTuningJobs", "pipelineJobs"):
          resource["state"] = "PIPELINE_STATE_PENDING" if collection == "pipelineJobs" else "JOB_STATE_PENDING"
        if collection == "schedules":
          resource["state"] = "ACTIVE"
        fake.resources[name] = resource
        return self._reply(200, resource)

      def do_GET(self):  # noqa: N802
        name = self.path.split("?")[0][len("/v1/"):]
        fake.requests.append({"method": "GET", "path": self.path, "collection": None, "body": None})
        resource = fake.resources.get(name)
        if resource is None:
          return self._reply(404, {"error": {"code": 404, "message": f"{name} not found"}})
        seen = fake._gets[name] = fake._gets.get(name, 0) + 1
        if "state" in resource and resource["state"].startswith("JOB_STATE"):
          resource["state"] = "JOB_STATE_RUNNING" if seen < 2 else "JOB_STATE_SUCCEEDED"
        return self._reply(200, resource)

    return Handler

  def start(self) -> "FakeVertex":
    self._thread.start()
    return self

  def stop(self) -> None:
    self._server.shutdown()
    self._server.server_close()


@contextlib.contextmanager
def running() -> Iterator[FakeVertex]:
  fake = FakeVertex().start()
  try:
    yield fake
  finally:
    fake.stop()
