"""The indexer's top-k selection: its definition, reference and entry point (:mod:`.selection`), the Triton kernels
(:mod:`.portable`), the sm90 Gluon kernel (:mod:`.hopper`) with the inline PTX it needs (:mod:`.smem_ptx`), both
algorithms step by step in PyTorch (:mod:`.steps`, :mod:`.radix`) and the torch-free reading of its runs
(:mod:`.report`). Importing the package loads no kernel: the report reads results files alone."""
