"""Shared stores of cache entries across a fleet: ``redis`` (a Redis server, entry by entry) and
``oci`` (an OCI registry, one archive layer per cache kind)."""

#: The Redis store's default key prefix (here, not in ``redis``: the CLI names it in its
#: options without importing the store).
REDIS_NAMESPACE = "sglang-warmup"
