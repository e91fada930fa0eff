"""Reading logs and writing run directories."""
