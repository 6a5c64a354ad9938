"""The DFlash block drafter (docs/dflash.md): its config and checkpoint, model, training, exact offline acceptance,
local greedy block decoding and GGUF export; `python -m eagle3lab.drafters.dflash` runs them."""
