"""What the `specdec` fixture hands a test: its measurement, and ways to measure more."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from .errors import ConfigError

if TYPE_CHECKING:
    import openai

    from .markers import Case
    from .measurement import CaseResult, RunRecord
    from .session import SpecDecSession


class SpecDec:
    """A specdec test's view: `result`/`summary` of its interleaved runs, plus custom measurements."""

    def __init__(self, session: SpecDecSession, nodeid: str, case: Case) -> None:
        self._session = session
        self.nodeid = nodeid
        self.case = case
        self._result: CaseResult | None = None

    @property
    def params(self) -> dict[str, Any]:
        return self.case.params()

    @property
    def result(self) -> CaseResult:
        if self._result is None:
            self._result = self._session.measure(self.nodeid, self.case)
        return self._result

    @property
    def summary(self) -> dict[str, Any]:
        return self.result.summary

    @property
    def runs(self) -> list[RunRecord]:
        return self.result.runs

    @property
    def reference_runs(self) -> list[RunRecord]:
        return self.result.reference_runs

    @property
    def valid(self) -> bool:
        return not self.result.invalid_runs

    def measure(self, **fields: Any) -> CaseResult:
        """Measure another single point (marker fields; lists not allowed) inside this test."""
        from .markers import expand

        cases = expand(fields, self._session.profile)
        if len(cases) != 1:
            raise ConfigError(f"specdec.measure() takes single values, got {len(cases)} combinations from {fields}")
        (case,) = cases
        return self._session.measure(f"{self.nodeid}::measure[{case.id()}]", case)

    def openai_client(self, arm: Literal["spec", "reference"] = "spec") -> openai.OpenAI:
        """An `openai.OpenAI` client bound to this test's live server (for custom requests and output checks)."""
        import openai

        session = self._session
        spec = session.server_spec(self.case, reference=(arm == "reference"))
        endpoint = session.endpoint(spec, reference=(arm == "reference"))
        return openai.OpenAI(base_url=f"{endpoint.base_url}/v1", api_key=session.settings.api_key or "EMPTY")

    def model(self, arm: Literal["spec", "reference"] = "spec") -> str:
        """The served model id to put in custom requests."""
        spec = self._session.server_spec(self.case, reference=(arm == "reference"))
        return self._session.endpoint(spec, reference=(arm == "reference")).model
