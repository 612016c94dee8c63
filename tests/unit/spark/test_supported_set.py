"""The installed libraries are a set PySpark supports (issue 33): PySpark checks pandas, pyarrow and numpy
against its own bounds when Spark starts and warns (pandas >= 3: "does not yet fully support") or fails;
the same checks, run here with warnings as errors, keep a resolved set it only tolerates from passing."""

from __future__ import annotations

import warnings

import pytest
from pyspark.sql.pandas.utils import (
    require_minimum_numpy_version,
    require_minimum_pandas_version,
    require_minimum_pyarrow_version,
)


@pytest.mark.parametrize("check", [require_minimum_pandas_version, require_minimum_pyarrow_version,
                                   require_minimum_numpy_version])
def test_the_installed_set_is_within_pysparks_declared_bounds(check: object) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check()  # type: ignore[operator]
