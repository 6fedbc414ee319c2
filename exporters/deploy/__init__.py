"""Deployment files derived from the one source of truth (ports table, SLO file, Alertmanager routing)."""
