"""The Criteo data's own schema: the fields of a TSV line and their column names.

The tensors a model takes and gives (names, dtypes, shapes) are the served
contract, :mod:`bundle.schema`; this module holds what is about the Criteo
data: a labeled TSV line is the label, ``NUM_DENSE`` integer counts ``I1..I13``
and ``NUM_CATEGORICAL`` hex categorical ids ``C1..C26``.
"""

from __future__ import annotations

from bundle.schema import NUM_CATEGORICAL, NUM_DENSE
from criteo.rows import CATEGORICAL_COLUMNS, DENSE_COLUMNS, MISSING_ID

#: Fields of one labeled Criteo TSV line: label, counts, categorical ids.
NUM_FIELDS = 1 + NUM_DENSE + NUM_CATEGORICAL

__all__ = ["CATEGORICAL_COLUMNS", "DENSE_COLUMNS", "MISSING_ID", "NUM_FIELDS"]
