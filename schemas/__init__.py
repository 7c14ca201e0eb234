"""Versioned event models of the egoline pipeline; JSON Schema copies live in `jsonschema/`."""
