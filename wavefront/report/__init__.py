"""Figures, tables and the paper draft from data/ (CPU only)."""
