"""core/dispatch."""
