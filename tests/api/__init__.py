"""Tests of the REST API (/api/v1/)."""
