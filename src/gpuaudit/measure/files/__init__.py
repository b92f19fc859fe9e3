"""Files: gpuaudit Parquet recordings, CSV and JSONL tables (``--map``), nvidia-smi logs.

``open_samples`` streams any of them as validated sample-table batches; ``read_samples``
reads one whole. The readers live in :mod:`~gpuaudit.measure.files.reader`, the column
mapping in :mod:`~gpuaudit.measure.files.mapping`, the nvidia-smi dialects in
:mod:`~gpuaudit.measure.files.nvidia_smi`.
"""

from gpuaudit.measure.files.reader import (
    FORMATS,
    FileSource,
    open_samples,
    parse_mapping,
    read_samples,
    write_recording,
)

__all__ = ["FORMATS", "FileSource", "open_samples", "parse_mapping", "read_samples",
           "write_recording"]
