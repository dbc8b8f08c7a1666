"""The kernel emitters and their planners: IR nodes and fused groups to instructions, written
through a ProgramBuilder (the EMITTERS registry in emit.py, the fused row, matmul and attention
kernels), with the plans and analyses they rest on (row plans, strided views, dead keys)."""
