"""The data contract: Criteo TSV format and columns, preprocessing, synthetic data."""
