"""The session layer: the event log, its projections, the store protocol and the writer."""
