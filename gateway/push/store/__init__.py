"""Push configs and the notification outbox: the interface (``store``) and its backends."""
