"""Plans: expressions, the loader, the plan model with its pure expansion, server facts."""
