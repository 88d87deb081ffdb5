"""TODO: this package's job."""
