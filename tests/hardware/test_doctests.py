"""The worked examples in the hardware modules' docstrings run as tests."""

from __future__ import annotations

import doctest
from types import ModuleType

import pytest

from cohabit.hardware import amd, classify, host, labels, nvidia


@pytest.mark.parametrize("module", [amd, classify, host, labels, nvidia], ids=lambda m: m.__name__)
def test_docstring_examples(module: ModuleType) -> None:
    result = doctest.testmod(module)
    assert result.failed == 0
    assert result.attempted > 0
