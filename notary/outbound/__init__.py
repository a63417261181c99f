"""Connections the notary opens: the dialer and its resolver, the prober, and the store's batched writer task."""
