"""The local endpoint's overhead: the same requests answered over HTTP by `python -m serving.serve` and in-process
by the session loader it wraps, at 1, 8 and 32 concurrent clients, side by side in one run.

Trains a churn model (the demo's data, 200 steps), starts the endpoint on a free port, then for each concurrency
sends --requests requests of --rows rows each (Vertex's `{"instances": [...]}` body), once through HTTP (keep-alive
connections, one per client) and once as direct calls of `predict.predict` from the same number of threads. Prints
requests/s, median and p95 latency for both, and the ratio HTTP / in-process.

    python -m scripts.bench.serve                        # about 2 minutes on 2 CPU cores
    python -m scripts.bench.serve --rows=32 --requests=2000
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from scripts import check_model
from scripts.bench import harness

REPO = harness.REPO
ENV = {**os.environ, "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9", "NO_GCE_CHECK": "true",
       "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": REPO}


def _model(directory: str) -> str:
  from scripts import demo_data  # pylint: disable=g-import-not-at-top

  demo_data.make(os.path.join(directory, "data"), num_train=4000, num_eval=512, num_shards=1)
  out = os.path.join(directory, "out")
  subprocess.run([sys.executable, "-m", "trainer.task", f"--train_data={directory}/data/train/*.tfrecord",
                  f"--output_dir={out}", "--train_steps=200", "--eval_steps=0"], env=ENV, check=True,
                 capture_output=True, timeout=600)
  return os.path.join(out, "model")


def _rows(directory: str, count: int) -> list[dict]:
  return check_model.instances_from_records(os.path.join(directory, "out", "model"),
                                        os.path.join(directory, "data", "eval", "*.tfrecord"), count)


def _measure(call, clients: int, requests: int) -> tuple[float, list[float]]:
  """requests/s and per-request latencies of `call(client)` from `clients` threads sharing `requests`."""
  per_client = requests // clients
  latencies: list[float] = []

  def client(index: int) -> list[float]:
    own = call(index)
    times = []
    for _ in range(per_client):
      started = time.perf_counter()
      own()
      times.append(time.perf_counter() - started)
    return times

  started = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(clients) as pool:
    for times in pool.map(client, range(clients)):
      latencies.extend(times)
  return len(latencies) / (time.perf_counter() - started), latencies


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--rows", type=int, default=8, help="instances per request")
  parser.add_argument("--requests", type=int, default=960, help="requests per measurement")
  args = parser.parse_args(argv)
  from serving import predict  # pylint: disable=g-import-not-at-top

  with tempfile.TemporaryDirectory(prefix="bench-serve-") as directory:
    model_dir = _model(directory)
    body = {"instances": _rows(directory, args.rows)}
    payload = json.dumps(body)
    server = subprocess.Popen([sys.executable, "-m", "serving.serve", f"--model_dir={model_dir}", "--port=0"],
                              env=ENV, stdout=subprocess.PIPE, text=True)
    try:
      started = json.loads(server.stdout.readline())
      port, route = int(started["listening"].rsplit(":", 1)[1]), started["predict"]
      model = predict.load(model_dir)

      def over_http(_):
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

        def send():
          connection.request("POST", route, body=payload, headers={"Content-Type": "application/json"})
          response = connection.getresponse()
          data = response.read()
          assert response.status == 200, data[:300]

        return send

      def in_process(_):
        return lambda: predict.predict(model, json.loads(payload))  # the server decodes JSON too

      for warm in (over_http, in_process):  # first calls pay for graph and connection set-up
        _measure(warm, 2, 20)
      print(f"{args.rows} rows per request, {args.requests} requests per measurement")
      print(f"{'clients':>7}  {'http req/s':>10}  {'p50 ms':>7}  {'p95 ms':>7}  {'in-process req/s':>16}  "
            f"{'p50 ms':>7}  {'p95 ms':>7}  {'http/in-process':>15}")
      for clients in (1, 8, 32):
        http_rate, http_lat = _measure(over_http, clients, args.requests)
        local_rate, local_lat = _measure(in_process, clients, args.requests)
        print(f"{clients:>7}  {http_rate:>10.0f}  {_ms(http_lat, 50):>7.2f}  {_ms(http_lat, 95):>7.2f}  "
              f"{local_rate:>16.0f}  {_ms(local_lat, 50):>7.2f}  {_ms(local_lat, 95):>7.2f}  "
              f"{http_rate / local_rate:>14.2f}x", flush=True)
      model.close()
    finally:
      server.terminate()
      server.wait(timeout=30)
  return 0


def _ms(latencies: list[float], percentile: int) -> float:
  return statistics.quantiles(latencies, n=100)[percentile - 1] * 1000


if __name__ == "__main__":
  sys.exit(main())
