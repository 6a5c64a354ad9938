"""eagle3lab: make EAGLE-3 speculative decoding pay off, reproducibly."""

import sys

# nbformat (papermill in every stage run, and the tests) imports jsonschema, whose optional IRI format check builds an
# Earley grammar as it is imported: rfc3987_syntax took 1.5 s of each stage run and 5 s of each test worker's
# collection. Nothing here checks IRI formats, and jsonschema leaves that check out when the import fails.
sys.modules.setdefault("rfc3987_syntax", None)

__version__ = "0.1.0"
