"""Exports of reasoner configs to other training stacks (MindSpeed-LLM for Ascend NPUs)."""
