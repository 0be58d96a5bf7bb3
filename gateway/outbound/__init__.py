"""Outbound side: discovering what peers offer, choosing a route, sending a call."""
