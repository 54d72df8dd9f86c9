"""One run against a warm server: the workload (datasets, types), the async streaming client, per-run
metrics, the interleaved reference/spec runner and the lossless checks.  Never imports pytest."""
