"""Sample CorDapps: ping/pong and a three-party trade."""
