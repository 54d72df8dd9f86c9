"""vLLM server processes and where they run: process control, the pool that reuses them per spec, GPU
leases, hardware detection and external endpoints.  Never imports pytest (like pytest-xprocess)."""
