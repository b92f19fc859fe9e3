"""integrate stage."""
