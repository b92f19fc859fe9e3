"""measure stage: the sources of the sample table, one folder per kind.

- ``files/``: recordings and logs on disk (Parquet, CSV, JSONL, nvidia-smi);
- ``live/``: NVML on this machine, sampled in a thread or a process, recorded crash-safe;
- ``fleet/``: Prometheus-compatible stores and dcgm-exporter endpoints.

``parquet_io`` is shared by the file reader and the live recorder.
"""
