"""vLLM: its pinned environment (`environment`), its launch line (`launch_line`), the server and its counters
(`server`), the draft-config fields it reads (`fields`), its doctor rules (`rules`) and its server probe (`probe`)."""
