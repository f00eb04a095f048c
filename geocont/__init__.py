"""geocont: geometric continuity experiments."""
