"""Reading logs: sources, file formats, record shapes, fields and timestamps -> normalised records and rejects."""
