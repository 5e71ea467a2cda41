"""The agent layer: the driver actor, its inbox, the turn/step machine, tools and lifecycle."""
