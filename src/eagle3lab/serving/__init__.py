"""Servers: the one OpenAI/SGLang HTTP client (client), process lifecycle (processes), SGLang launch lines (launch),
benchmarking a running server (bench), and the params-profile CLI (sglang)."""
