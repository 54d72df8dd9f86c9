"""From per-run values to verdicts: the statistics (pure functions), the verdicts against stored
baselines, and the baseline files.  Never imports pytest."""
