"""What a session leaves behind for people: the HTML report, the pytest-benchmark export and the
dry-run estimate."""
