"""The A2A tasks this agent answered: the interface (``store``) and its backends."""
