"""deploy stage."""
