"""Reuse analysis over the requests table: ideal-cache reuse, attribution, prefix classes, capacity curves."""
