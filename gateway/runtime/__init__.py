"""Running an agent: its composition, the services it starts and stops, workers, the lock."""
