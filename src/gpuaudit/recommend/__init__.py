"""recommend stage."""
