"""Measured data: the typed measurement, the schema and store, sweeps (CPU only)."""
