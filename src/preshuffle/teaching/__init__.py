"""The workbook's teaching code: the logits kernel grown one idea at a time, what Triton compiles those steps to for
sm90a, the plain-Triton TMA step before the Gluon kernel, and the reader's exercises with their checkers. Nothing in
the product imports it."""
