"""Tables larger than memory and their operations.

Where tables live (``placement``: in the graph or hot/cold), the hot rows (``hot_rows``),
the lookups in a graph (``lookups``), the row store and its CLI (``row_store``,
``row_store_cli``), the split into stage + dense model (``hot_cold_graph``), the ensemble
entries (``ensemble``), their FP16/INT8 variants (``hot_cold_variants``), the rollout of a
new hot set (``rollout``), and synthetic models of any size (``synthetic_model``,
``synthetic_model_cli``).
"""
