"""geocont: geometric continuity experiments."""

# The results store's default folder (geocont.store). Here, beside nothing heavy, so the command-line
# options can show it as their default without importing polars.
DEFAULT_STORE = "geocont-results"
