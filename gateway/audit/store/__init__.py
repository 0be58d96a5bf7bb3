"""Where the audit chain is appended and read: the interfaces (``store``) and backends."""
