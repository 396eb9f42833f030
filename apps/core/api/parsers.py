"""The API's JSON parser: documents nested deeper than ``jsondocs.MAX_DEPTH`` are a 400, not a server error."""

from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from apps.core import jsondocs


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser, refusing documents the standard library cannot decode for depth or that nest deeper
    than any field of the API."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            data = None
            too_deep = True
        else:
            too_deep = jsondocs.depth_exceeds(data)
        if too_deep:
            raise ParseError(f"JSON parse error - {jsondocs.TooDeep()}")
        return data
