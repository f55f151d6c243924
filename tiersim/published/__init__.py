"""Published figures the validation compares with, copied into the repository with their provenance."""
