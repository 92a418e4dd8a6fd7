"""Verification tools, shared by the tests, the benchmark and the notebooks: problem builders (:mod:`.inputs`),
numeric checks against the float64 reference (:mod:`.numeric`) and GPU timers (:mod:`.timing`)."""
