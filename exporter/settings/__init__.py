"""The configuration: its schema (schema.py) and how it is loaded from a file and the environment (loading.py)."""
