"""``triton-recsys``: the bundle's stages as subcommands of one console script."""
