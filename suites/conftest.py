"""Shared set-up of the nightly suites. The plugin (pytest-specdec) provides the `specdec` fixture
and marker; suites are plain pytest modules that declare what to measure."""
