"""The bundle's lab: the commands and code that exist to reproduce the committed results under
``benchmarks/``, kept out of the product's own command lines.

- :mod:`lab.commands` (run as ``python -m lab <name>``): each command builds its options and
  calls the library function of its module;
- the benchmarks, one module each: :mod:`lab.soak` (and the checked load the fault tests
  drive), :mod:`lab.client_cost`, :mod:`lab.precision`, :mod:`lab.serving_defaults`,
  :mod:`lab.gpu`, :mod:`lab.kernels`, :mod:`lab.cold_reads`, :mod:`lab.cold_tier`,
  :mod:`lab.model_analyzer`, :mod:`lab.raw_rows`;
- :mod:`lab.faults`: the fault table.

The lab is a layer of its own: it may import every stage (it measures them with the load
tests' one engine, :mod:`loadtest.engine`), and nothing imports it.
"""
