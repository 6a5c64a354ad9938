"""The DFlash block drafter (docs/dflash.md): its config and checkpoint, model, training, exact offline acceptance,
local greedy block decoding and GGUF export. The one CLI runs them on a DFlash folder as on an EAGLE-3 one:
`eagle3lab train --drafter dflash`, `eagle3lab acceptance|bench|generate|tune|export`."""
