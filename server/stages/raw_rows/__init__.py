"""The raw-row stage of the raw-row ensembles; ``export.raw_rows`` copies its files."""

from pathlib import Path

#: The folder holding the stage's files.
SOURCE_DIR = Path(__file__).resolve().parent
#: The files of this folder a stage's version folder gets.
SOURCE_FILES: tuple[str, ...] = ("model.py",)
#: The name the rules module (``criteo/rows.py``, numpy only) is copied under, beside them.
RULES_FILE = "criteo_rows.py"
