"""Fixtures for the core tests."""

from __future__ import annotations

import pytest

from gpuaudit.cli.audit import demo_path
from gpuaudit.schema import Recording


@pytest.fixture(scope="session")
def nanogpt() -> Recording:
    """The bundled real recording (nanoGPT on 8x H100), read whole."""
    from gpuaudit.measure.files import read_samples

    return read_samples(demo_path())
