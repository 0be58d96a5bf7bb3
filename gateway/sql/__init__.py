"""SQL the stores share between their SQLite and PostgreSQL backends: the dialect."""
