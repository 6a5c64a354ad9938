"""The launch doctor: is an EAGLE-3 draft actually used as launched?

findings (Finding, Report) <- launch (the launch line: SGLang's, or vLLM's through vllm, which also knows how vLLM
loads a draft) + artifacts (draft checkpoint, target config) -> algorithm, vocab, settings (static checks) + probe
(a running server) -> diagnosis (`diagnose`) -> cli (`eagle3lab doctor`).
"""
