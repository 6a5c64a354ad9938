"""llama.cpp: its pinned build (`build`), its launch line (`launch_line`), the server and its counters (`server`),
the draft's GGUF format and export (`gguf`), the draft-config fields its converter reads (`fields`), its doctor rules
(`rules`) and server probe (`probe`), and where a round's time goes (`round_split`, a command)."""
