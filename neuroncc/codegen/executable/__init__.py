"""The program form: the Executable (instruction streams, HBM buffer table, JSON codec) and its
listing, and the builders that write one (ProgramBuilder with its dependency tracker and tile
pools; KernelBuilder for tile programs written by hand). Nothing here reads the IR graph."""
