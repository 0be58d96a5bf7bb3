"""A2A wire helpers with no side: message parts to payload bytes, JSON numbers."""
