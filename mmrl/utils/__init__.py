"""Small shared utilities (compatibility shims)."""
