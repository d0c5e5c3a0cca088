"""The torch tests' precondition, imported first by each: torch importable, else the
importing test module is skipped saying how to install it -- or fails under CI=true, which
installs the torch extra (scripts/install.sh)."""
from __future__ import annotations

import pytest

from tests.conftest import UNDER_CI

try:
    import torch  # noqa: F401 - the check
except ImportError:                     # pragma: no cover - CI installs the torch extra
    if UNDER_CI:
        raise
    pytest.skip("needs torch: pip install -e '.[torch]' (scripts/install.sh does)",
                allow_module_level=True)
