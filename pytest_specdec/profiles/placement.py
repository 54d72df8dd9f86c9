"""Where and how a session's servers run, from the profile's [placement] and the command line: which
vLLM command each arm gets, whether the two arms' servers may be alive at once, on which CPUs, at which
priority, and what the profile makes impossible (caught at collection, not hours later)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_specdec.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pytest_specdec.measure.types import Prompt
    from pytest_specdec.profiles import Profile
    from pytest_specdec.profiles.starts import Fit, StartPlan
    from pytest_specdec.vllm.command import ServerSpec


@dataclass(frozen=True)
class Placement:
    profile: Profile
    endpoint: bool  # --specdec-endpoint: the servers run elsewhere
    max_servers: int  # --specdec-max-servers
    block_runs_option: int | None  # --specdec-block-runs
    runs: int  # runs per arm at the first look
    host: str  # --specdec-host: where the servers we start bind
    arms: int = 2  # servers a test needs at once: 3 in an A/B session (reference, base, candidate), 4 across installs

    @property
    def _raw(self) -> dict[str, Any]:
        return dict(self.profile.raw.get("placement", {}))

    def co_resident(self) -> bool:
        """Whether a test's reference and spec servers can be alive at once (always, on the CPU)."""
        return self.endpoint or (self.max_servers >= 2 and bool(self._raw.get("co_resident", True)))

    def max_alive(self) -> int:
        """Servers the pool keeps alive at once (the dry-run estimate counts restarts with it too); never fewer
        than a test's arms when they co-reside, or an A/B test's third server would stop its first."""
        return max(self.max_servers, self.arms) if self.co_resident() else 1

    def start_together(self) -> bool:
        """Whether servers that fit beside each other start at once (`profiles/starts.py`): on a GPU profile whose
        servers co-reside, unless its [placement] start_together = false; never on the CPU, where the starts
        would share the cores (and the endpoints' servers are not ours)."""
        return (not self.endpoint and self.profile.device != "cpu" and self.co_resident()
                and bool(self._raw.get("start_together", True)))

    def start_plan(self, now: Sequence[ServerSpec], upcoming: Sequence[ServerSpec], alive: Sequence[ServerSpec],
                   gpus: Sequence[str] = ()) -> StartPlan | None:
        """Which servers to start together before a test that needs ``now``: `starts.plan_start` over the specs'
        keys, with room as the leases on ``gpus`` (the GPUs this process may lease) would find it, else as their
        memory fractions on one set of GPUs (None: one at a time, as without it)."""
        from pytest_specdec.profiles.starts import plan_start

        if not self.start_together():
            return None
        specs = [*now, *upcoming, *alive]
        return plan_start([s.key() for s in now], [s.key() for s in upcoming], [s.key() for s in alive],
                          self.fit(specs, gpus), self.max_alive(), self.apart(specs, gpus))

    def fit(self, specs: Sequence[ServerSpec], gpus: Sequence[str] = ()) -> Fit:
        """Whether servers of ``specs`` (by key) have room together: on ``gpus`` as the leases place them (each
        server's GPUs and memory fraction), else as memory fractions on one set of GPUs. The session and the dry
        run's estimate ask the same."""
        from pytest_specdec.profiles.starts import fraction_fit, lease_fit
        from pytest_specdec.servers.gpus import memory_fraction

        if gpus:
            return lease_fit(_needs(specs), gpus)
        return fraction_fit({s.key(): memory_fraction(s.args) for s in specs})

    def apart(self, specs: Sequence[ServerSpec], gpus: Sequence[str] = ()) -> Fit:
        """Whether servers of ``specs`` started at once would share no GPU (`starts.lease_apart`); where ``gpus``
        are not known they share one set, and none start at once. The session and the dry run ask the same."""
        from pytest_specdec.profiles.starts import lease_apart, one_set_apart

        return lease_apart(_needs(specs), gpus) if gpus else one_set_apart

    def block_runs(self) -> int | None:
        """None: interleave pairs; else the block size of the arms' alternation (servers cannot co-reside)."""
        if self.co_resident():
            return None
        return self.block_runs_option or -(-self.runs // 2)

    def server_cpus(self) -> frozenset[int] | None:
        """CPU profiles: where servers start, leaving the profile's `[placement] client_cpus` to the client."""
        from pytest_specdec.servers.pool import split_cpus

        if self.profile.device != "cpu":
            return None
        return split_cpus(int(self._raw.get("client_cpus", 0)))

    def server_nice(self) -> int:
        """How much lower the servers' scheduling priority is than the client's ([placement] server_nice)."""
        return int(self._raw.get("server_nice", 0))

    def server_spec(self, method: str, k: int | None, speculative_config: dict[str, Any] | None,
                    reference: bool, profile: Profile | None = None) -> ServerSpec:
        """The server an arm of a test needs: the profile's preset for `method`, or raw vLLM JSON; ``profile``
        stands in for the session's (an A/B session's base: the same profile with the base's drafts)."""
        from pytest_specdec.profiles import server_spec
        from pytest_specdec.vllm.command import ServerSpec

        if reference or method == "none":  # a preset's reference serves the preset's target (raw JSON: the profile's)
            spec = server_spec(self.profile, "none", None, target_of=method if speculative_config is None else None)
        elif speculative_config is not None:
            base = server_spec(self.profile, "none", None)
            spec = ServerSpec(model=base.model, speculative_config=speculative_config, args=base.args, env=base.env,
                              revision=base.revision)
        else:
            spec = server_spec(profile or self.profile, method, k)
        return dataclasses.replace(spec, host=self.host)

    def check_possible(self, dataset: str, size: int, num_prompts: int | None, max_tokens: int | None,
                       records: Sequence[Prompt] = (), concurrency: int = 1,
                       lengths: tuple[int, int, float] | None = None) -> None:
        """What only the profile and the dataset can tell is impossible. ``records`` are the prompts the test
        sends: each asks for its max_tokens, which must leave room for the prompt, and with the prompt's
        ``input_tokens`` counted (the target's tokenizer) both must fit --max-model-len, as vLLM requires.
        Endpoint mode skips the server-limit checks (model length, sequences at once): someone
        else's server has its own."""
        from pytest_specdec.profiles.resolve import max_model_len

        if num_prompts is not None and num_prompts > size:
            raise ConfigError(
                f"specdec: num_prompts={num_prompts} but dataset {dataset!r} has {size} prompts; "
                f"lower num_prompts or use a larger dataset (prompts are never repeated)"
            )
        seqs, source = (concurrency, "") if self.endpoint else max_num_seqs(self.profile)
        if concurrency > seqs:
            raise ConfigError(
                f"specdec: concurrency={concurrency} is above the {seqs} requests a server of profile "
                f"{self.profile.name!r} runs at once ({source}); the rest would wait in its queue and the test "
                f"would measure the queue, not speculation; lower concurrency to at most {seqs}"
            )
        sent = size if num_prompts is None else num_prompts
        if concurrency > sent:
            where = f"num_prompts={num_prompts}" if num_prompts is not None else f"dataset {dataset!r} has {size}"
            raise ConfigError(
                f"specdec: concurrency={concurrency} but a run sends {sent} prompts ({where}), so at most {sent} "
                f"are ever in flight; lower concurrency to at most {sent} or send more prompts"
            )
        limit = max_model_len(self.profile)
        if lengths is not None and limit is not None and not self.endpoint:  # synthetic: (input_len, output_len, ratio)
            from pytest_specdec.measure.datasets.synthetic import length_bounds

            _, longest_in, _, longest_out = length_bounds(*lengths, num_special=0)
            if longest_in + longest_out > limit:
                raise ConfigError(
                    f"specdec: input_len={lengths[0]} + output_len={lengths[1]} (up to {longest_in} + {longest_out} "
                    f"with range_ratio {lengths[2]:g}) is above profile {self.profile.name!r}'s --max-model-len "
                    f"{limit}; lower input_len or output_len")
        if max_tokens is not None and limit is not None and not self.endpoint and max_tokens >= limit:
            raise ConfigError(
                f"specdec: max_tokens={max_tokens} leaves no room for the prompt: profile "
                f"{self.profile.name!r} serves with --max-model-len {limit}; lower max_tokens below {limit}"
            )

        def asks(p: Prompt) -> int:  # the marker's max_tokens replaces the records'
            return max_tokens if max_tokens is not None else p.max_tokens

        longest = max(records, key=lambda p: asks(p) + (p.input_tokens or 0), default=None)
        if longest is None or limit is None or self.endpoint:
            return
        if longest.input_tokens is not None and longest.input_tokens + asks(longest) > limit:
            lower = ("lower max_tokens in the marker" if max_tokens is not None else
                     "lower its max_tokens in the file, or set max_tokens in the marker")
            total, room = longest.input_tokens + asks(longest), max(limit - longest.input_tokens, 0)
            raise ConfigError(
                f"specdec: dataset {dataset!r}: prompt {longest.id!r} has {longest.input_tokens} input tokens "
                f"(counted by the target's tokenizer) and asks for max_tokens={asks(longest)}, {total} in all, "
                f"above the --max-model-len {limit} profile {self.profile.name!r} serves with; {lower} to at most "
                f"{room}, or leave the prompt out"
            )
        if max_tokens is None and longest.max_tokens >= limit:
            raise ConfigError(
                f"specdec: dataset {dataset!r}: prompt {longest.id!r} asks for max_tokens={longest.max_tokens}, which "
                f"leaves no room for the prompt: profile {self.profile.name!r} serves with --max-model-len {limit}; "
                f"lower it below {limit} in the file, or set max_tokens in the marker"
            )


def max_num_seqs(profile: Profile) -> tuple[int, str]:
    """How many requests a server of `profile` runs at once, and where that number comes from: its `[server]
    args` --max-num-seqs, else vLLM's default for the OpenAI server (EngineArgs.get_batch_defaults: 128 per
    CPU rank; on GPUs 256, 1024 from 70 GB of memory except on an A100, the largest assumed when the profile's
    GPUs do not say), doubled by --performance-mode throughput and capped by --max-num-batched-tokens, as
    vLLM does with its defaults."""
    from pytest_specdec.vllm.command import arg_value

    args = profile.server_args
    if arg_value(args, "--max-num-seqs") is not None:
        seqs = _whole(profile, args, "--max-num-seqs")
        return seqs, f"--max-num-seqs {seqs} in its [server] args"
    if profile.device == "cpu":
        ranks = profile.server_gpus  # TP x PP ranks
        seqs, source = 128 * ranks, f"vLLM's default on the CPU, 128 per rank x {ranks}"
    elif any("a100" in name.lower() for name in profile.nvidia_smi_names):
        seqs, source = 256, "vLLM's default on an A100"
    else:
        seqs, source = 1024, "vLLM's largest GPU default"
    if arg_value(args, "--performance-mode") == "throughput":
        seqs, source = 2 * seqs, f"{source}, doubled by --performance-mode throughput"
    if arg_value(args, "--max-num-batched-tokens") is not None:
        tokens = _whole(profile, args, "--max-num-batched-tokens")
        if tokens < seqs:
            seqs, source = tokens, f"--max-num-batched-tokens {tokens} in its [server] args"
    return seqs, f"{source}; set --max-num-seqs in the profile's [server] args to say"


def _whole(profile: Profile, args: Sequence[str], flag: str) -> int:
    """A whole-number server argument (1 when absent); anything else names the profile and the flag."""
    from pytest_specdec.vllm.command import arg_value

    value = arg_value(args, flag) or "1"
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"profile {profile.name!r}: [server] args {flag} {value!r} is not a whole number") from None


def _needs(specs: Sequence[ServerSpec]) -> dict[str, tuple[int, float]]:
    """Each server's GPUs (TP x PP x DP) and memory fraction, by key: what the leases place."""
    from pytest_specdec.servers.gpus import gpus_needed, memory_fraction

    return {s.key(): (gpus_needed(s.args, s.speculative_config), memory_fraction(s.args)) for s in specs}
