"""Stands in for `vllm serve` in server-lifecycle tests: `python fake_vllm.py serve MODEL --port P ...`.

FAKE_VLLM_MODE: `ok` (serve /health and /v1/models, with a child process in the group),
`crash` (exit 3 after printing a log line), `hang` (never answer), `slow` (ready after 1 s).
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import time


def main() -> None:
    args = sys.argv[1:]
    assert args[0] == "serve", args
    model = args[1]
    port = int(args[args.index("--port") + 1])
    host = args[args.index("--host") + 1]
    mode = os.environ.get("FAKE_VLLM_MODE", "ok")
    print(f"fake vllm {mode} {' '.join(args)}", flush=True)
    print(
        "INFO Initializing a V1 LLM engine (v0.0.0-fake) with config: model='%s', "
        "speculative_config=SpeculativeConfig(method='ngram', num_spec_tokens=3), "
        "max_seq_len=1024, enable_prefix_caching=True, compilation_config={\"level\": 3, "
        "\"sizes\": [1, 2]}, seed=0" % model,
        flush=True,
    )
    if mode == "crash":
        print("RuntimeError: fake engine failed to start", flush=True)
        sys.exit(3)
    if mode == "hang":
        time.sleep(3600)
    if mode == "slow":
        time.sleep(1)
    # A grandchild in our process group: the server's stop must take it down too.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    with open(os.environ["FAKE_VLLM_CHILD_PID_FILE"], "w") as f:
        f.write(str(child.pid))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps({"data": [{"id": model}]}).encode() if self.path == "/v1/models" else b""
            self.send_response(200 if self.path in ("/health", "/v1/models") else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    http.server.HTTPServer((host, port), Handler).serve_forever()


if __name__ == "__main__":
    main()
