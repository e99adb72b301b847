"""What TD3 and SAC share (not an algorithm): `config` (their common fields, the sparse methods and
RLx2's per-environment presets; no JAX import) and `loop` (the replay row, the learner state and the
explore / learn steps that both runners drive)."""
