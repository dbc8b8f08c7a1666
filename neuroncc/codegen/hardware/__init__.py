"""The machine as data: the NeuronCore instruction set (isa), the target presets with their
capacities, clocks and bandwidths (targets), and the per-instruction cost formulas (costs).
Passes, codegen and the runtime all read them; nothing here builds or runs a program."""
