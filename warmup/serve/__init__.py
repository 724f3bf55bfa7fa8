"""Serving the plan: transports, the driver, the --warmups hook, the plugin, the launcher."""
