"""Developer tools (dev PKI, demo). The serving runtime never imports this package."""
