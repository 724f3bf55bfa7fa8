"""Shared stores of cache entries across a fleet: ``redis`` (a Redis server, entry by entry) and
``oci`` (an OCI registry, one archive layer per cache kind)."""
