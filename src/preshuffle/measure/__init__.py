"""Measuring tools: a kernel that only reads a call's pages (the floor under every layout) and a compiled kernel's
resources and machine code, read without a GPU."""
