"""Finite-network covariance simulation and comparison with the SDE (THEORY sections 4-6)."""
