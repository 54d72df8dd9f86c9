"""The streaming client against the fake server: token counting, timing formulas, what is sent, errors."""

from __future__ import annotations

import gc
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from fakes import FakeConfig, FakeServer, FakeServerProcess
from pytest_specdec.measure.client import run_load_sync
from pytest_specdec.measure.types import Api, Prompt, RequestSample, Sampling

MODEL = "fake-model"


def chat_prompts(n: int, max_tokens: int = 16) -> list[Prompt]:
    return [Prompt(id=f"p{i}", messages=[{"role": "user", "content": f"question number {i}"}], max_tokens=max_tokens)
            for i in range(n)]


@pytest.fixture
def server(request: pytest.FixtureRequest, fake_server: Callable[..., FakeServer]) -> FakeServer:
    """A fake server with the test's FakeConfig (indirect parameter), else the default one."""
    return fake_server(getattr(request, "param", None))


def test_sample_formulas() -> None:
    s = RequestSample(prompt_id="x", start=0.0, ttft_s=0.1, e2e_s=0.4, output_tokens=4,
                      chunks=[(0.1, 1), (0.3, 2), (0.4, 1)])
    assert s.tpot_s == pytest.approx((0.4 - 0.1) / 3)
    assert s.itls_chunk_s == pytest.approx([0.2, 0.1])
    assert s.itls_token_s == pytest.approx([0.1, 0.1, 0.1])  # 0.2 s over 2 tokens, then 0.1 s over 1
    one = RequestSample(prompt_id="y", start=0.0, ttft_s=0.1, e2e_s=0.1, output_tokens=1, chunks=[(0.1, 1)])
    assert one.tpot_s is None and one.itls_chunk_s == [] and one.itls_token_s == []


def test_sampling_sends_every_field() -> None:
    body = Sampling(temperature=0.0).to_request()
    assert set(body) == {"temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
                         "repetition_penalty", "ignore_eos"}


@pytest.mark.parametrize("server", [FakeConfig(k=3, acceptance=(1.0, 1.0, 1.0), output_tokens=13)],
                         indirect=True)
@pytest.mark.parametrize("api", ["chat", "completions"])
def test_tokens_counted_per_chunk_from_usage(server: FakeServer, api: Api) -> None:
    if api == "chat":
        prompts = chat_prompts(4, max_tokens=50)
    else:
        prompts = [Prompt(id=f"c{i}", prompt=f"text {i}", max_tokens=50) for i in range(4)]
    res = run_load_sync(server.base_url, MODEL, prompts, Sampling(temperature=0.0), concurrency=2, api=api)
    for s in res.samples:
        assert s.error is None, s.error
        # prefill token alone, then every step carries 1 + 3 accepted tokens, the last one cut to fit 13
        assert [n for _, n in s.chunks] == [1, 4, 4, 4]
        assert s.output_tokens == 13 and s.prompt_tokens == (3 if api == "chat" else 2)  # words, in the fake
        assert s.text == " tok" * 13
        assert s.finish_reason == "length"
        assert len(s.itls_chunk_s) == 3 and len(s.itls_token_s) == 12
        assert s.tpot_s == pytest.approx(
            (s.e2e_s - s.ttft_s) / 12)  # type: ignore[operator]  # float | None; set once a request succeeds


@pytest.mark.parametrize("server", [FakeConfig(k=2, acceptance=(0.7, 0.3), eos_prob=0.02)], indirect=True)
def test_random_acceptance_token_sums(server: FakeServer) -> None:
    res = run_load_sync(server.base_url, MODEL, chat_prompts(20, 40), Sampling(temperature=0.7), concurrency=5)
    assert res.n_failed == 0
    multi = 0
    for s in res.samples:
        assert sum(n for _, n in s.chunks) == s.output_tokens <= 40
        assert s.output_tokens == s.text.count("tok")
        multi += sum(1 for _, n in s.chunks if n > 1)
    assert multi > 0  # chunks do carry several tokens, so counting chunks would be wrong


def test_temperature_and_sampling_always_sent(server: FakeServer) -> None:
    # The fake refuses a request without temperature: prove it, then that every request we send has it.
    req = urllib.request.Request(server.base_url + "/v1/chat/completions", method="POST",
                                 data=json.dumps({"model": MODEL, "stream": True,
                                                  "messages": [{"role": "user", "content": "x"}]}).encode(),
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 400
    e.value.close()
    samp = Sampling(temperature=0.0, top_p=0.9)
    res = run_load_sync(server.base_url, MODEL, chat_prompts(3), samp, concurrency=3)
    assert res.n_failed == 0 and res.sampling == samp
    for body in server.requests:
        assert {k: body[k] for k in samp.to_request()} == samp.to_request()
        assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
        assert "seed" not in body  # vLLM's per-request-seed path is slower and unlike production


def test_cache_salt_sent_and_warmup_salted_apart(server: FakeServer) -> None:
    res = run_load_sync(server.base_url, MODEL, chat_prompts(3), Sampling(temperature=0.0), concurrency=2,
                        cache_salt="run-42", warmup=2)
    salts = [b.get("cache_salt") for b in server.requests]
    assert salts == ["run-42:warmup"] * 2 + ["run-42"] * 3
    assert len(res.samples) == 3 and res.warmup == 2 and res.warmup_failed == 0
    server.requests.clear()
    run_load_sync(server.base_url, MODEL, chat_prompts(1), Sampling(temperature=0.0), concurrency=1)
    assert "cache_salt" not in server.requests[0]


@pytest.mark.parametrize("server", [FakeConfig(step_s=0.01, output_tokens=8)], indirect=True)
def test_concurrency_reached_and_capped(server: FakeServer) -> None:
    res = run_load_sync(server.base_url, MODEL, chat_prompts(24), Sampling(temperature=0.0), concurrency=8)
    assert res.max_in_flight == 8 and res.reached_concurrency
    assert server.state.peak_active == 8
    assert res.duration_s > 0 and res.t_start < res.t_end
    assert res.loop_lag_max_s < 0.5


def test_no_garbage_collection_while_a_run_is_timed(server: FakeServer) -> None:
    """A collection on every allocation outside the run (threshold 1): none starts between its start and end,
    where it would pause the client (and in-process servers) and be read as the server's slowness."""
    starts: list[float] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            starts.append(time.perf_counter())

    thresholds = gc.get_threshold()
    gc.callbacks.append(note)
    gc.set_threshold(1)
    try:
        res = run_load_sync(server.base_url, MODEL, chat_prompts(16), Sampling(temperature=0.0), concurrency=4)
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(note)
    assert res.n_failed == 0 and gc.isenabled()
    assert any(t < res.t_start for t in starts) and any(t > res.t_end for t in starts)  # it ran around the run
    assert not [t for t in starts if res.t_start <= t <= res.t_end]


@pytest.mark.parametrize("server", [FakeConfig(step_s=0.005, output_tokens=4)], indirect=True)
def test_open_loop_poisson(server: FakeServer) -> None:
    res = run_load_sync(server.base_url, MODEL, chat_prompts(20), Sampling(temperature=0.0), concurrency=4,
                        rate=200.0, seed=1)
    assert res.n_failed == 0 and res.rate == 200.0 and res.max_in_flight <= 4
    assert all(s.queue_s >= 0 for s in res.samples)
    starts = sorted(s.start for s in res.samples)
    assert starts[-1] - starts[0] > 0.02  # arrivals are spread out, not a burst


@pytest.mark.parametrize("server", [FakeConfig(error_share=0.4, abort_share=0.3, output_tokens=8)],
                         indirect=True)
def test_errors_recorded_per_sample(server: FakeServer) -> None:
    res = run_load_sync(server.base_url, MODEL, chat_prompts(30), Sampling(temperature=0.0), concurrency=4)
    errs = res.error_counts()
    assert len(res.samples) == 30
    assert any(e.startswith("HTTP 500") for e in errs)
    assert errs.get("stream ended before data: [DONE]", 0) > 0
    assert 0 < res.n_failed < 30 and not res.all_failed


@pytest.mark.parametrize("server", [FakeConfig(continuous_usage=False)], indirect=True)
def test_missing_usage_is_an_error(server: FakeServer) -> None:
    res = run_load_sync(server.base_url, MODEL, chat_prompts(2), Sampling(temperature=0.0), concurrency=2)
    assert res.all_failed
    assert all("carried no usage" in (s.error or "") for s in res.samples)


def test_server_down_is_visible_not_raised() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens on it once closed
    res = run_load_sync(f"http://127.0.0.1:{port}", MODEL, chat_prompts(3), Sampling(temperature=0.0),
                        concurrency=2, timeout_s=5)
    assert res.all_failed and res.n_failed == 3
    assert all("Connect" in (s.error or "") for s in res.samples)
    assert res.metrics_error is not None and res.metrics_before is None


def test_client_cpu_per_token_at_256(record_property: Callable[[str, object], None]) -> None:
    """Client CPU seconds per streamed token at concurrency 256, the server in another process."""
    cfg = FakeConfig(k=3, acceptance=(0.7, 0.5, 0.3), step_s=0.005, output_tokens=64)
    with FakeServerProcess(cfg) as url:
        prompts = chat_prompts(512, max_tokens=64)
        run_load_sync(url, MODEL, prompts[:16], Sampling(temperature=0.0), concurrency=16)  # warm the server
        cpu0, wall0 = time.process_time(), time.perf_counter()
        res = run_load_sync(url, MODEL, prompts, Sampling(temperature=0.0), concurrency=256)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    tokens = sum(s.output_tokens for s in res.samples)
    chunks = sum(len(s.chunks) for s in res.samples)
    per_token_us = cpu / tokens * 1e6
    record_property("client_cpu_us_per_token", per_token_us)
    print(f"\nclient CPU {cpu:.2f} s over {wall:.2f} s wall for {tokens} tokens in {chunks} chunks: "
          f"{per_token_us:.1f} us/token, {cpu / chunks * 1e6:.1f} us/chunk, max in flight {res.max_in_flight}, "
          f"loop lag max {res.loop_lag_max_s * 1000:.1f} ms")
    assert res.n_failed == 0 and res.max_in_flight == 256
    assert per_token_us < 1000  # sanity only: 1 ms of client CPU per token would cap us at 1000 tok/s


@pytest.mark.parametrize("server", [FakeConfig(ttft_s=2.0)], indirect=True)
def test_timeout_recorded(server: FakeServer) -> None:
    res = run_load_sync(server.base_url, MODEL, chat_prompts(2), Sampling(temperature=0.0), concurrency=2,
                        timeout_s=0.2, collect_metrics=False)
    assert [s.error for s in res.samples] == ["timeout after 0.2 s"] * 2
    assert res.metrics_before is None and res.metrics_error is None


@pytest.mark.parametrize("server", [FakeConfig(ttft_s=3.0), FakeConfig(step_s=3.0)], indirect=True,
                         ids=["silent-from-the-start", "silent-mid-stream"])
def test_a_server_that_sends_nothing_fails_in_the_idle_timeout_not_the_total(server: FakeServer) -> None:
    """Both requests go silent together: the first to time out stops the run and cancels the other, which
    keeps what it received (it may time out in the same instant, before the cancel reaches it)."""
    t0 = time.monotonic()
    res = run_load_sync(server.base_url, MODEL, chat_prompts(2), Sampling(temperature=0.0), concurrency=2,
                        timeout_s=60, idle_timeout_s=0.5, collect_metrics=False)
    idle = "idle stream: nothing received for 0.5 s"
    cancelled = "cancelled: another request of the run got nothing for 0.5 s"
    errors = [s.error for s in res.samples]
    assert idle in errors and set(errors) <= {idle, cancelled}
    # A stream silent after its first token keeps that token, cancelled or not: the server counted it.
    assert [s.output_tokens for s in res.samples] == [0 if server.config.ttft_s > 1 else 1] * 2
    assert time.monotonic() - t0 < 2.5  # not the 3 s the server stays silent, let alone the 60 s total


@pytest.mark.parametrize("rate", [None, 50.0], ids=["closed-loop", "open-loop"])
@pytest.mark.parametrize("server", [FakeConfig(hang_after=3, step_s=0.001)], indirect=True)
def test_a_run_stops_at_its_first_silent_request(server: FakeServer, rate: float | None) -> None:
    """A hung server costs one idle timeout per run, not one per remaining request: the first request that
    gets nothing stops the run, and the ones after it are not sent and say why."""
    t0 = time.monotonic()
    res = run_load_sync(server.base_url, MODEL, chat_prompts(12), Sampling(temperature=0.0), concurrency=1,
                        timeout_s=60, idle_timeout_s=0.3, rate=rate, warmup=1)
    elapsed = time.monotonic() - t0
    errors = [s.error for s in res.samples]
    assert errors[:2] == [None, None] and errors[2] == "idle stream: nothing received for 0.3 s"
    assert errors[3:] == ["not sent: another request of the run got nothing for 0.3 s"] * 9
    assert res.metrics_after is not None  # the counters are still read, within the idle timeout
    assert elapsed < 1.5  # one idle timeout, not the 10 x 0.3 s of every remaining request


#: A final usage chunk carrying ``metrics`` (``%`` its value), and a well-formed per-request acceptance (vLLM 0.32's).
_METRICS = b'{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}, "metrics": %s}'
_SPEC_DECODING = (b'{"speculative_decoding": {"mean_acceptance_length": 1.0, "draft_acceptance_rate": 0.0, '
                  b'"acceptance_histogram": [0, 0, 0, 0], "num_spec_steps": 0, "num_accepted_draft_tokens": 0, '
                  b'"num_draft_tokens": 0, "num_spec_tokens": 3}}')


@pytest.mark.parametrize(("payload", "error"), [
    (b'{"choices": [', "bad stream data: JSONDecodeError: Expecting value*"),
    (b'{"choices": [], "usage": {"completion_tokens": 1}} {"x": 1}', "bad stream data: ValueError: extra data*"),
    (b'{"choices": [{"delta": {"content": "\xff"}}]}', "bad stream data: UnicodeDecodeError*"),
    # vLLM's per-request acceptance (the final usage chunk's metrics.speculative_decoding): never dropped when wrong
    (_METRICS % b'{"speculative_decoding": {"num_spec_steps": 1}}',
     "bad stream data: ValueError: metrics.speculative_decoding has no `num_accepted_draft_tokens`*"),
    (_METRICS % b'3', "bad stream data: ValueError: a chunk's `metrics` is 3, not an object"),
    (_METRICS % _SPEC_DECODING + b"\n\ndata: " + _METRICS % _SPEC_DECODING,
     "bad stream data: ValueError: metrics.speculative_decoding came twice in one stream"),
], ids=["truncated", "trailing", "not-utf8", "spec-decoding-incomplete", "metrics-not-an-object",
        "spec-decoding-twice"])
def test_malformed_stream_is_a_sample_error(payload: bytes, error: str) -> None:
    """A server that breaks the SSE/JSON protocol fails the request with what it sent, never the run."""
    import fnmatch
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(b"data: " + payload + b"\n\ndata: [DONE]\n\n")

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        res = run_load_sync(f"http://127.0.0.1:{httpd.server_address[1]}", MODEL, chat_prompts(1),
                            Sampling(temperature=0.0), concurrency=1, collect_metrics=False, timeout_s=10)
    finally:
        httpd.shutdown()
        httpd.server_close()
    (sample,) = res.samples
    assert sample.error is not None and fnmatch.fnmatch(sample.error, error), sample.error
