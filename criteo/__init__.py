"""The data contract: Criteo TSV format, feature schema, preprocessing, synthetic data."""
