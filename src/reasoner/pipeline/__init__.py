"""Whole recipes: the registry of stage kinds (registry.py), recipe files (recipe.py), resolving
and running them with skip / rerun / resume (run.py, `reasoner run`), and the memory and time
estimate of every stage before it runs (plan.py, `reasoner plan`).
"""
