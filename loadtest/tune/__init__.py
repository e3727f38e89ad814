"""``python -m loadtest tune``: the fastest serving configuration whose p99 stays under a budget.

- :mod:`~loadtest.tune.space`: what is searched (server configurations and client loads);
- :mod:`~loadtest.tune.stats`: the confidence intervals that decide a step early;
- :mod:`~loadtest.tune.search`: the search through the local tritonserver, its confirmation
  and the winner (:func:`~loadtest.tune.search.run_tune`);
- :mod:`~loadtest.tune.report`: the tune's ``report.md``, ``report.json`` and ``frontier.png``.
"""
