"""SpecForge as a peer trainer: its pinned environment (`make specforge`), the CPU workarounds it runs with, its
inputs written from one of our runs (feature records, vocabulary mapping, draft config), its training, the export of
its checkpoint into our draft format, and the comparison of both trainers on the same data."""
