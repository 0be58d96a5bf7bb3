"""Plan task checkpoints: the interface (``store``), rows both backends share, backends."""
