"""The sidecar (a readiness gate for a server started by others) and prebake."""
