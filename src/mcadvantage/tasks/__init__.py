"""Reasoning tasks: how a response splits into steps (segmenters) and how an answer is graded (verifiers), for
GSM8K, MATH and plain newline-separated steps; the grading process that keeps math-verify out of the trainer's
process. Nothing here imports TRL or torch."""
