"""The C++ kernels: ISA selection (isa), source generation (codegen), eager build and binding (native)."""
