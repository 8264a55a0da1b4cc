"""The limiting neural covariance SDE of shaped Transformers (THEORY section 3)."""
