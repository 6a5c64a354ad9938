"""SGLang (GPUs; it cannot run on this CPU): its launch lines (`launch`), reading them for the doctor
(`launch_line`), a running server's probe (`probe`) and benchmark (`bench`, `cli`), and the draft-config fields it
reads (`fields`). Tested against recorded responses."""
