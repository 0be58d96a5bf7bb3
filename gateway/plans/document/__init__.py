"""The plan as written: its model, the JSON Schema subset, JSON paths and static checks."""
