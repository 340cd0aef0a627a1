"""Reproductions of the papers' experiments (``ebfl reproduce ...``)."""
