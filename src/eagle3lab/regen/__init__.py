"""Regeneration: the target answers every prompt, resumable and accounted, locally or through a server."""
