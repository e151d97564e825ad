import functools

import pytest

from costmodel.models import resolve_model
from costmodel.trace import capture


@functools.lru_cache(maxsize=None)
def captured(name: str, dtype: str = "fp32"):
    return capture(resolve_model(name), dtype=dtype)


@pytest.fixture
def graph_of():
    return captured
