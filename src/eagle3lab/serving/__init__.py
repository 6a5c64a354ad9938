"""Servers: process lifecycle, the OpenAI/SGLang HTTP client and SGLang launch lines."""
