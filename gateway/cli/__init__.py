"""The ``a2a-gateway`` command line."""
