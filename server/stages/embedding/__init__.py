"""The embedding stage of hot/cold models; ``export.tables.ensemble`` copies its files."""

from pathlib import Path

#: The folder holding the stage's files.
SOURCE_DIR = Path(__file__).resolve().parent
#: The files a ``<family>_embedding`` version folder gets: the python-backend model, its numpy
#: core, and the core's ``io_uring`` reads.
SOURCE_FILES: tuple[str, ...] = ("model.py", "hot_cold_lookup.py", "uring.py")
