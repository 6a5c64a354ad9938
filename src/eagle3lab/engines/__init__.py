"""The engine layer: one folder per serving engine (`sglang`, `vllm`, `llamacpp`), each holding everything that
engine is (its environment or build, its launch line read and written, its server and counters, its draft format,
its doctor rules and probe, its cost measurements, the draft-config fields it reads), behind the interfaces of
`base`. An engine folder imports no other engine; `registry` lists them. DESIGN.md says how to add one."""
