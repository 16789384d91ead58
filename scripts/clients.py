"""Keyword arguments for Google Cloud API clients (aiplatform_v1, Cloud Build): the real endpoint, or a local one
(the tests' fake control plane), which is reached anonymously over plain HTTP REST. One rule for every client."""

from __future__ import annotations

from typing import Any


def client_kwargs(api_endpoint: str | None, *, default_endpoint: str | None = None) -> dict[str, Any]:
  """`client_options` with `api_endpoint` (else `default_endpoint`, else the library's own); anonymous REST for
  an http:// endpoint."""
  kwargs: dict[str, Any] = {}
  endpoint = api_endpoint or default_endpoint
  if endpoint:
    kwargs["client_options"] = {"api_endpoint": endpoint}
  if api_endpoint and api_endpoint.startswith("http://"):
    from google.auth.credentials import AnonymousCredentials  # pylint: disable=g-import-not-at-top
    kwargs.update(credentials=AnonymousCredentials(), transport="rest")
  return kwargs


def vertex_kwargs(region: str, api_endpoint: str | None) -> dict[str, Any]:
  """For any aiplatform_v1 service client: Vertex AI's regional endpoint, or a local one."""
  return client_kwargs(api_endpoint, default_endpoint=f"{region}-aiplatform.googleapis.com")
