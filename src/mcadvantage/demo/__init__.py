"""The offline CPU demo (``python -m mcadvantage.demo``): a synthetic GSM8K-format arithmetic task, a tiny
character-level Llama, a supervised warm-up, then VinePPO, with a learning-curve plot and an HTML page of
responses coloured by their Monte Carlo step advantages.

Importing this package imports only the task generator (no torch, TRL or vLLM).
"""

from mcadvantage.demo.task import ArithmeticProblem, Operation, generate_problems, make_problem, to_rows

__all__ = ["ArithmeticProblem", "Operation", "generate_problems", "make_problem", "to_rows"]
