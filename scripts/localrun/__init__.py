"""Runs a Vertex AI custom job's replicas on this machine with Vertex's contract (`python -m scripts.local_vertex`):
`planning` turns the job's pools into replicas with their environment, `install` installs the staged package
as Vertex's executor does, `supervise` runs and restarts them with Vertex's job semantics, `report` sums up."""
